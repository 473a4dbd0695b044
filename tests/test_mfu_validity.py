"""An MFU above 100% is impossible: everywhere trainbench shows an MFU (a run's summary,
`results`, `jobs show`, plots, `predict`) such a figure is shown as INVALID with the line
saying the peak is wrong, never as a number. One rule, metrics.mfu_problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from helpers import run_cli
from test_results_summary import trainbench_run
from trainbench.metrics import mfu_problem
from trainbench.results import summarize_experiment

LOGS = Path(__file__).parent / "data" / "logs"
# The seeds' real NeMo 2 log of Llama 3.1 8B BF16 on 8 H100 (MFU about 62% of 989 TFLOPS).
LLAMA_8B = LOGS / "nemo2" / "experiments" / "pretrain_llama3.1_8b_bf16_8"
LLAMA_8B_LOG = next(LLAMA_8B.glob("**/log-*.out"))


def test_the_rule_accepts_up_to_100_percent_and_nothing_else():
    for ok in (None, 0.0, 0.61, 61.9, 100.0):
        assert mfu_problem(ok, 989, "catalog") is None
    for bad in (100.01, 341.2, float("inf"), float("nan"), -1.0):
        line = mfu_problem(bad, 0.0006744, "measured GEMM")
        assert line.startswith("INVALID: MFU ") and "\n" not in line
        assert "peak must be wrong" in line and "--peak-tflops" in line and "--gpu" in line
    assert "341.2%" in mfu_problem(341.2, 0.0006744, "measured GEMM")
    assert "0.0006744 TFLOPS (measured GEMM)" in mfu_problem(341.2, 0.0006744, "measured GEMM")


def test_real_log_against_a_too_small_peak_is_invalid_in_results(tmp_path):
    """The 8B log read as if on A100s (312 TFLOPS): 62% of 989 would be 196% of 312."""
    good = summarize_experiment(LLAMA_8B_LOG)
    assert good.mfu_problem is None and 50 < good.mfu_pct < 70
    res = run_cli("results", str(LLAMA_8B), "--gpu", "a100", "--format", "json")
    assert res.returncode == 0, res.stderr
    (row,) = json.loads(res.stdout)["experiments"]
    assert row["mfu_pct"] is None  # no consumer of the JSON can take it for a figure
    assert row["mfu_invalid_pct"] == pytest.approx(good.mfu_pct * 989 / 312, rel=1e-9)
    assert row["mfu_problem"].startswith("INVALID: MFU 196.")
    table = run_cli("results", str(LLAMA_8B), "--gpu", "a100")
    assert table.returncode == 0, table.stderr
    (row_line,) = [line for line in table.stdout.splitlines() if "│ pretrain_llama3.1_8b" in line]
    assert "INVALID" in row_line and "196" not in row_line
    assert "pretrain_llama3.1_8b_bf16_8: INVALID: MFU 196." in table.stdout


def too_small_peak_run(root: Path) -> Path:
    """A trainbench CPU experiment whose run.json peak (1e-5 TFLOPS) is far too low."""
    return trainbench_run(root, run_json={"device_name": "CPU", "peak_tflops": 1e-5,
                                          "peak_source": "measured GEMM", "world_size": 2},
                          exit_json={"exit_code": 0, "reason": "completed"})


def test_trainbench_experiment_with_a_too_low_peak_is_invalid(tmp_path):
    r = summarize_experiment(too_small_peak_run(tmp_path))
    assert r.mfu_pct is None and r.mfu_invalid_pct > 100
    assert r.mfu_invalid_pct == pytest.approx(100 * r.tflops_per_gpu / 1e-5, rel=1e-9)
    assert r.mfu_problem in r.notes
    assert not any("MFU against the measured GEMM peak" in n for n in r.notes)


def test_run_summary_shows_invalid_instead_of_the_figure(tmp_path):
    from rich.console import Console

    from trainbench.launch.run_cli import print_summary
    r = summarize_experiment(too_small_peak_run(tmp_path))
    out = Console(record=True, width=400)
    print_summary(out, r)
    text = out.export_text()
    (mfu_row,) = [line for line in text.splitlines() if "MFU" in line]
    assert "INVALID: MFU" in mfu_row and "--peak-tflops" in mfu_row
    assert f"{r.mfu_invalid_pct:.2f}%" not in text


def test_jobs_show_keeps_no_invalid_figure(tmp_path):
    from trainbench.launch.jobs import JobsDB
    exp = too_small_peak_run(tmp_path)
    result = summarize_experiment(exp)
    db = JobsDB(tmp_path)
    job = db.add("local", "1", result.name, str(exp), (exp / "plan.json").read_text(), "RUNNING")
    db.update(job, state="COMPLETED", exit_code=0, results=result.to_dict())
    res = run_cli("jobs", "show", str(job), root=tmp_path)
    assert res.returncode == 0, res.stderr
    assert '"mfu_pct": null' in res.stdout
    assert '"mfu_problem": "INVALID: MFU' in res.stdout


def test_scaling_plot_draws_the_ceiling_and_no_invalid_point(tmp_path):
    from trainbench.results.plot import plot_scaling
    valid = summarize_experiment(LLAMA_8B_LOG)
    invalid = summarize_experiment(LLAMA_8B_LOG, gpu="a100")
    assert invalid.mfu_problem is not None
    fig = plot_scaling([valid, invalid], tmp_path / "scaling.png", "published")
    assert (tmp_path / "scaling.png").stat().st_size > 0
    ax_mfu = fig.axes[1]
    assert ax_mfu.get_ylim()[1] >= 100
    ceilings = [line for line in ax_mfu.get_lines()
                if list(line.get_ydata()) == [100.0, 100.0] and "100%" in line.get_label()]
    assert len(ceilings) == 1
    points = [y for line in ax_mfu.get_lines() if line.get_label().endswith("(measured)")
              for y in line.get_ydata()]
    assert points == [pytest.approx(valid.mfu_pct)]  # the invalid run is no point
    assert any("INVALID" in t.get_text() for t in ax_mfu.texts)


def test_predict_with_impossible_calibration_shows_invalid(tmp_path):
    """Constants calibrated above 100% efficiency predict an impossible MFU."""
    config = tmp_path / "cluster.yaml"
    config.write_text(yaml.safe_dump({"calibration": {"h100": {
        "gemm_eff_bf16": 4.0, "attn_eff": 4.0, "scan_eff": 4.0, "hbm_eff": 4.0,
        "layer_overhead_us": 0.0}}}))
    args = ("predict", "-w", "pretrain_llama3.1", "-s", "8b", "--dtype", "bf16", "--scale", "8")
    res = run_cli(*args, "--format", "json", env={"TRAINBENCH_CONFIG": str(config)})
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["mfu"] is None and data["mfu_invalid"] > 1
    assert data["mfu_problem"].startswith("INVALID: MFU")
    table = run_cli(*args, env={"TRAINBENCH_CONFIG": str(config)})
    assert table.returncode == 0, table.stderr
    mfu_rows = [line for line in table.stdout.splitlines() if "MFU (" in line]
    assert len(mfu_rows) == 2 and all("INVALID: MFU" in line for line in mfu_rows)
    # The defaults predict a possible MFU, printed as a figure.
    plain = run_cli(*args, "--format", "json", env={"TRAINBENCH_CONFIG": str(tmp_path / "none")})
    assert 0 < json.loads(plain.stdout)["mfu"] <= 1


def test_flops_with_an_impossible_step_time_shows_invalid():
    """Llama 3.1 8B at 1 s/step on 8 H100 would be 767% of the bf16 peak."""
    args = ("flops", "-w", "pretrain_llama3.1", "-s", "8b", "--gbs", "128", "--gpus", "8",
            "--dtype", "bf16")
    bad = run_cli(*args, "--step-time", "1")
    assert bad.returncode == 0, bad.stderr
    (line,) = [x for x in bad.stdout.splitlines() if "MFU" in x]
    assert "INVALID: MFU 767." in line and "--peak-tflops" in line
    good = run_cli(*args, "--step-time", "12.27")  # seed 002's published step time
    (line,) = [x for x in good.stdout.splitlines() if "MFU" in x]
    assert "INVALID" not in line and "% of 989 TFLOPS" in line
