"""`trainbench results` and `trainbench plot` through the real Typer app, on a directory
holding a trainbench run, NeMo 1/2 runs and a MaxText run."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainbench.cli import app
from trainbench.results.status import SUCCESS

from test_results_summary import trainbench_run

LOGS = Path(__file__).parent / "data" / "logs"
runner = CliRunner()


@pytest.fixture
def tree(tmp_path) -> Path:
    """A trainbench CPU run, the NeMo 2 (one success, one failure), NeMo 1 and MaxText
    fixtures, and a batch-script output that is not an experiment."""
    root = tmp_path / "runs"
    trainbench_run(root, run_json={"device_name": "cpu", "peak_tflops": 0.05,
                                   "peak_source": "measured GEMM", "world_size": 2},
                   exit_json={"exit_code": 0, "reason": "completed"})
    for sub in ("nemo2/experiments/pretrain_llama3.1_8b_bf16_8",
                "nemo2/experiments/pretrain_llama3.1_70b_bf16_64", "nemo1/results",
                "maxtext/results"):
        shutil.copytree(LOGS / sub, root / sub)
    return root


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_one_consistent_json_table(tree):
    res = invoke("results", str(tree), "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    rows = {r["format"]: r for r in data["experiments"]}
    assert sorted(map(str, rows)) == ["None", "maxtext", "nemo1", "nemo2", "trainbench"]
    assert len({tuple(r) for r in data["experiments"]}) == 1  # every row has the same keys
    assert data["summary"] == {"experiments": 5, "success": 4, "incomplete": 0, "failed": 1,
                               "invalid": 0, "unrecognised": 0, "running": 0,
                               "success_rate_pct": 80.0}
    assert rows["trainbench"]["peak_source"] == "measured GEMM"
    assert rows["nemo2"]["verdict"] == "within 5%"
    assert rows["maxtext"]["workload"] == "pretrain_llama2"
    assert rows["nemo1"]["window_start"] == 22 and rows["nemo1"]["window_end"] == 88
    for fmt in ("trainbench", "nemo2", "nemo1", "maxtext"):
        assert rows[fmt]["status"] == SUCCESS and rows[fmt]["step_time_mean_s"] > 0
        assert rows[fmt]["mfu_pct"] > 0 and rows[fmt]["mfu_convention"] == "published"


def test_rich_table_and_summary_line(tree):
    res = invoke("results", str(tree))
    assert res.exit_code == 0, res.output
    out = res.stdout
    for name in ("pretrain_llama3.1_tiny_bf16_gpus2_20250101-000000", "pretrain_llama3.1_8b_bf16_8",
                 "maxtext-64_70b_1407993", "nemo-megatron-nemotron4_340b_128_1359101"):
        assert name in out
    assert "sbatch_" not in out  # a batch script's output is not an experiment
    assert ("5 experiment(s): 4 Success, 0 Incomplete, 1 Failed, 0 Invalid; success rate 80% "
            "(4/5); MFU convention: published") in out
    assert ("Failed (CUDA out of memory): no training step was logged: "
            "torch.OutOfMemoryError: CUDA out of memory.") in out


def test_csv_matches_json_and_sorting(tree):
    res = invoke("results", str(tree), "--format", "csv", "--sort=-gpus")
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert [int(r["gpus"]) for r in rows] == [128, 64, 64, 8, 2]
    js = json.loads(invoke("results", str(tree), "--format", "json").stdout)["experiments"]
    by_path = {r["path"]: r for r in js}
    for row in rows:
        assert float(row["gpus"]) == by_path[row["path"]]["gpus"]
        assert row["status"] == by_path[row["path"]]["status"]


def test_window_option_applies_to_every_run(tree):
    res = invoke("results", str(tree), "--format", "json", "--window", "5-9")
    runs = json.loads(res.stdout)["experiments"]
    for r in runs:
        if r["status"] == SUCCESS:
            assert (r["window_start"], r["window_end"], r["window_count"]) == (5, 9, 5)


def test_output_file_is_new_and_never_overwritten(tree, tmp_path):
    out = tmp_path / "results.csv"
    res = invoke("results", str(tree), "--format", "csv", "-o", str(out))
    assert res.exit_code == 0, res.output
    first = out.read_text()
    assert first.startswith("name,path,") and len(first.splitlines()) == 6
    again = invoke("results", str(tree), "--format", "csv", "-o", str(out))
    assert again.exit_code == 2 and "already exists" in again.output
    assert out.read_text() == first


@pytest.mark.parametrize("args,message", [
    (["--window", "44-11"], "--window"),
    (["--window", "x"], "is not of the form A-B"),
    (["--sort", "speed"], "cannot sort by 'speed'"),
    (["--format", "xml"], "unknown --format 'xml'"),
    (["--convention", "fancy"], "unknown FLOPs convention"),
    (["-w", "pretrain_gpt"], "unknown workload"),
    (["--gpu", "tpu9"], "unknown GPU type"),
])
def test_bad_input_is_one_clear_line(tree, args, message):
    res = invoke("results", str(tree), *args)
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainbench: error: ") and message in lines[0]


def test_missing_path_and_empty_tree(tmp_path):
    res = invoke("results", str(tmp_path / "nope"))
    assert res.exit_code == 2 and "does not exist" in res.output
    (tmp_path / "empty").mkdir()
    res = invoke("results", str(tmp_path / "empty"))
    assert res.exit_code == 2 and "no experiments found" in res.output


def test_foreign_log_options_on_the_command_line():
    res = invoke("results", str(LOGS / "megatron" / "megatron-bridge-llama3-8b.log"), "-w",
                 "pretrain_llama3.1", "-s", "8b", "--dtype", "fp8", "--scale", "8",
                 "--format", "json")
    (row,) = json.loads(res.stdout)["experiments"]
    assert (row["format"], row["gpus"], row["ref_step_time_s"]) == ("megatron", 8, 9.33)


def png_checks(path: Path) -> None:
    import matplotlib.image as mpimg
    import numpy as np
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = mpimg.imread(path)
    height, width = pixels.shape[:2]
    assert width >= 600 and height >= 400
    rgb = pixels[..., :3]
    non_white = np.mean(np.any(rgb < 0.95, axis=-1))
    assert non_white > 0.02, f"{path.name} is nearly blank ({non_white:.3%} drawn)"
    assert rgb.std() > 0.05


def test_plot_writes_real_pngs(tree, tmp_path):
    out = tmp_path / "plots"
    res = invoke("plot", str(tree), "-o", str(out))
    assert res.exit_code == 0, res.output
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([
        "scaling.png", "loss.png", "step_time_maxtext-64_70b_1407993.png",
        "step_time_nemo-megatron-nemotron4_340b_128_1359101.png",
        "step_time_pretrain_llama3.1_8b_bf16_8.png",
        "step_time_pretrain_llama3.1_tiny_bf16_gpus2_20250101-000000.png"])
    for png in out.iterdir():
        png_checks(png)
    again = invoke("plot", str(tree), "-o", str(out))
    assert again.exit_code == 2 and "already exists" in again.output


def test_importing_the_results_commands_imports_neither_torch_nor_matplotlib():
    code = ("import sys, trainbench.results.cli, trainbench.results.summary, "
            "trainbench.results.report, trainbench.results.plot; "
            "bad = [m for m in ('torch', 'matplotlib', 'numpy') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_unknown_formats_are_unrecognised_and_left_out_of_the_success_rate(tmp_path):
    """Issue 16, defects 1 and 4: a Megatron-DeepSpeed log under a name that is not
    log-*.out is found and read; a nanochat log is listed as Unrecognised, not Failed, the
    success rate counts the readable runs only, and one line names the formats read."""
    root = tmp_path / "mixed"
    root.mkdir()
    for src in ("megatron/arguments-dump.log",
                "megatron-deepspeed/bigscience-tr11-176b-excerpt.log",
                "nanochat/base-train.log"):
        shutil.copy(LOGS / src, root / Path(src).name)
    res = invoke("results", str(root), "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["summary"] == {"experiments": 3, "success": 1, "incomplete": 1, "failed": 0,
                               "invalid": 0, "unrecognised": 1, "running": 0,
                               "success_rate_pct": 50.0}
    status = {r["name"]: r["status"] for r in data["experiments"]}
    assert status == {"arguments-dump": "Success", "bigscience-tr11-176b-excerpt": "Incomplete",
                      "base-train": "Unrecognised"}
    out = invoke("results", str(root)).stdout
    assert ("3 experiment(s): 1 Success, 1 Incomplete, 0 Failed, 0 Invalid, 1 Unrecognised; "
            "success rate 50% (1/2 readable)") in out
    assert ("1 log(s) in a format trainbench does not read, left out of the success rate; "
            "formats read: trainbench, NeMo 2, NeMo 1 (progress bars), Megatron-LM / "
            "Megatron-Bridge, Megatron-DeepSpeed, MaxText, torchtitan") in out


def test_failure_class_and_line_in_the_table(tmp_path):
    """Issue 16, defect 5: the detail line names the class and the line."""
    shutil.copy(LOGS / "failures" / "slurm-time-limit.log", tmp_path / "log-job.out")
    out = invoke("results", str(tmp_path)).stdout
    assert ("job: Failed (Slurm time limit): stopped at iteration 182 of 0..249999: "
            "slurmstepd: error: *** JOB 1407993 ON node001 CANCELLED AT 2024-11-21T10:02:44 "
            "DUE TO TIME LIMIT ***") in out


def test_a_log_in_no_format_that_states_a_failure_is_listed(tmp_path):
    """A file not named log-* with no step line is still an experiment when its end
    states a known cause of failure (here the NCCL watchdog of pytorch/pytorch#118369)."""
    shutil.copy(LOGS / "nemo1" / "watchdog-after-progress-bar.log", tmp_path / "train.log")
    (tmp_path / "sbatch_x.out").write_text("srun: job 1 queued\nExperiment finished\n")
    data = json.loads(invoke("results", str(tmp_path), "--format", "json").stdout)
    (row,) = data["experiments"]
    assert (row["name"], row["status"], row["failure_class"]) == ("train", "Failed",
                                                                  "NCCL timeout")


def test_an_unreadable_experiment_is_named_and_the_others_are_reported(tree):
    """Issue 37: one metrics.jsonl without read permission used to end `results` with a raw
    `[Errno 13]` line and no table. The command runs as an unprivileged user in a user
    namespace (root reads any file), where the tree's owner is that user."""
    locked = next(tree.glob("**/metrics.jsonl"))
    locked.chmod(0)
    try:
        res = subprocess.run(["unshare", "--user", "--map-user=65534", sys.executable, "-m",
                              "trainbench.cli", "results", str(tree), "--format", "json"],
                             capture_output=True, text=True, timeout=300)
    finally:
        locked.chmod(0o644)
    if res.returncode != 0 and "unshare" in res.stderr:
        pytest.skip(f"no user namespace here: {res.stderr.strip()}")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["summary"]["experiments"] == 4  # the five of `tree`, less the locked one
    line = f"{locked.parent}: cannot read {locked}: Permission denied, not read"
    assert data["unread"] == [line]
    assert res.stderr.strip() == f"trainbench: warning: {line}"
