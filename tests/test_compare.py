"""`trainbench compare` and measured profiling overhead (issue #17 items 3 and 6).

Two real tiny runs (one rank, fp32, 4 steps) that differ only in `--env NCCL_ALGO=Ring`
and `--set mbs=1`, shared by the module (the profiling overhead is checked on
tests/test_profiling.py's profiled run); the statistics and the
ranking of condition differences are checked in-process against hand-derived values.
"""

from __future__ import annotations

import json
import math
import statistics

import pytest

from trainbench.results.compare import (METHOD_RUNS, METHOD_STEPS, condition_differences,
                                        is_performance_env, load_side, metric_rows)
from trainbench.results.stats import t_quantile, t_two_sided_p, welch_test

from helpers import read_metrics, run_cli, train

WORKLOAD = "pretrain_llama3.1"


# --- Student's t and Welch's test against textbook values -------------------------------

# Two-sided 95% critical values t_{0.975, dof} as printed in the NIST/SEMATECH e-Handbook of
# Statistical Methods, table 1.3.6.7.2, and in every textbook's t table.
@pytest.mark.parametrize("dof,t975", [(1, 12.706), (2, 4.303), (5, 2.571), (10, 2.228),
                                      (30, 2.042), (120, 1.980)])
def test_t_quantile_matches_the_printed_table(dof, t975):
    assert t_quantile(0.05, dof) == pytest.approx(t975, abs=0.0006)
    assert t_two_sided_p(t975, dof) == pytest.approx(0.05, abs=0.0002)


@pytest.mark.parametrize("t", [0.3, 1.0, 2.5, 10.0])
def test_t_tail_has_its_closed_forms_at_one_and_two_degrees(t):
    # dof 1 is the Cauchy distribution: P(|T| >= t) = 1 - (2/pi) atan(t).
    assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), rel=1e-9)
    # dof 2: P(|T| >= t) = 1 - t / sqrt(t^2 + 2).
    assert t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(t * t + 2), rel=1e-9)


def test_welch_test_on_a_hand_worked_example():
    # a = 10, 12, 14: mean 12, sample variance ((-2)^2 + 0 + 2^2) / 2 = 4.
    # b = 20, 22, 24, 26, 28: mean 24, sample variance (16 + 4 + 0 + 4 + 16) / 4 = 10.
    # Squared standard errors: 4/3 and 10/5 = 2, sum 10/3; t = 12 / sqrt(10/3) = 6.5727.
    # Welch-Satterthwaite: (10/3)^2 / ((4/3)^2 / 2 + 2^2 / 4) = (100/9) / (17/9) = 100/17.
    # The table: t_{0.999, 5} = 5.893 and t_{0.999, 6} = 4.317 are both below 6.57, so the
    # two-sided p < 0.002; the 95% half-width is t_{0.975, 5.88} * sqrt(10/3), between
    # t_{0.975, 6} = 2.447 and t_{0.975, 5} = 2.571 times 1.8257: 4.4675 to 4.6939.
    test = welch_test([10, 12, 14], [20, 22, 24, 26, 28])
    assert (test.mean_a, test.mean_b, test.diff) == (12, 24, 12)
    assert test.t == pytest.approx(6.5727, abs=1e-4)
    assert test.dof == pytest.approx(100 / 17, rel=1e-12)
    assert test.p < 0.002 and test.outside_noise is True
    half = (test.ci95_high - test.ci95_low) / 2
    assert 4.4675 < half < 4.6939
    assert (test.ci95_low + test.ci95_high) / 2 == pytest.approx(12)

    # Overlapping samples: variances 1 and 1, squared standard errors 1/3 + 1/3 = 2/3,
    # t = 1 / sqrt(2/3) = 1.2247 on (2/3)^2 / (2 * (1/3)^2 / 2) = 4 degrees of freedom,
    # below t_{0.975, 4} = 2.776: within noise.
    near = welch_test([1, 2, 3], [2, 3, 4])
    assert near.t == pytest.approx(1.2247, abs=1e-4) and near.dof == pytest.approx(4)
    assert near.outside_noise is False and near.ci95_low < 0 < near.ci95_high

    one = welch_test([1.0], [2.0, 3.0])
    assert one.outside_noise is None and "at least 2 per side" in one.reason


# --- ranking the differences in conditions ------------------------------------------------

def _info(mbs: int, env: dict, torch: str, power: float, host: str, omp: str,
          nccl_debug: str | None, throttled: bool, clock: float, watts: float) -> dict:
    """A run as run_info gives it: plan.json and run.json, written by hand."""
    cond_env = {"OMP_NUM_THREADS": omp, **env}
    if nccl_debug:
        cond_env["NCCL_DEBUG"] = nccl_debug
    return {
        "plan": {"workload": WORKLOAD, "size": "tiny", "dtype": "bf16", "gpus": 8,
                 "layout": {"tp": 1, "pp": 1, "cp": 1, "dp": 8, "vp": 1}, "mbs": mbs,
                 "gbs": 64, "seq_len": 128, "recompute": "none",
                 "features": {"profile": "", "nccl_trace": False},
                 "env": [[k, v] for k, v in env.items()],
                 "name": "x", "out_dir": f"/somewhere/{host}"},
        "run": {"conditions": {
            "schema": 1, "trainbench": "0.1.0", "python": "3.11.7", "torch": torch,
            "cuda": "12.8", "nccl": "2.27.3",
            "host": {"hostname": host, "kernel": "Linux 6.8", "os": "Ubuntu 24.04"},
            "cpu": {"model": "Xeon", "cores": 112, "threads_per_rank": 14, "flags": ["avx2"]},
            "memory_bytes": 2 * 2**40,
            "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{host}-{i}",
                      "driver": "570.86", "power_limit_w": power, "sm_clock_max_mhz": 1980,
                      "sm_clock_mhz": 1980, "ecc": True} for i in range(8)],
            "topology": "GPU0 X NV18", "slurm": {}, "env": cond_env, "missing": []},
            "telemetry": {"source": "nvml", "throttled": throttled,
                          "throttle_reasons": ["sw power cap"] if throttled else [],
                          "sm_clock_mhz": {"min": clock, "mean": clock, "max": clock},
                          "power_w": {"min": watts, "mean": watts, "max": watts}}},
    }


def test_differences_are_ranked_plan_first_logging_last():
    a = _info(mbs=2, env={"NCCL_ALGO": "Ring"}, torch="2.13.0", power=700.0, host="node1",
              omp="8", nccl_debug=None, throttled=False, clock=1980.0, watts=650.0)
    b = _info(mbs=1, env={}, torch="2.12.1", power=500.0, host="node2", omp="14",
              nccl_debug="INFO", throttled=True, clock=1975.0, watts=480.0)
    diffs, notes = condition_differences([a], [b])
    order = [d.key for d in diffs]
    assert order == [
        "mbs",                          # the plan
        "env.NCCL_ALGO", "env.OMP_NUM_THREADS",   # environment that changes algorithms/threads
        "version.torch",                # versions
        "telemetry.throttled", "telemetry.throttle_reasons",  # throttling, then settings
        "gpu.power_limit_w", "telemetry.power_w.mean",
        "host.hostname",                # the host
        "env.NCCL_DEBUG",               # logging only
    ]
    # A clock 0.25% apart is a reading's jitter, not a difference; the uuids and the
    # output directory are not conditions.
    assert "telemetry.sm_clock_mhz.mean" not in order
    by_key = {d.key: d for d in diffs}
    assert (by_key["env.NCCL_ALGO"].change, by_key["env.NCCL_ALGO"].a,
            by_key["env.NCCL_ALGO"].b) == ("removed", "Ring", None)
    assert by_key["env.NCCL_DEBUG"].change == "added"
    assert (by_key["gpu.power_limit_w"].a, by_key["gpu.power_limit_w"].b) == (700.0, 500.0)
    assert [d.rank for d in diffs] == list(range(1, len(diffs) + 1))
    assert notes == []

    # Two nodes on B, each with its conditions-<host>.json: the second node's lower power
    # limit shows beside the first's, and the GPUs of both count.
    node2 = json.loads(json.dumps(b["run"]["conditions"]))
    node2["host"]["hostname"] = "node3"
    for gpu in node2["gpus"]:
        gpu["power_limit_w"] = 400.0
    b2 = {**b, "nodes": [b["run"]["conditions"], node2]}
    diffs, _ = condition_differences([a], [b2])
    by_key = {d.key: d for d in diffs}
    assert by_key["gpu.count"].a == 8 and by_key["gpu.count"].b == 16
    assert by_key["gpu.power_limit_w"].b == "500.0 (x8), 400.0 (x8)"
    assert by_key["host.hostname"].b == "node2 (x1), node3 (x1)"

    # A run without recorded conditions: only what plan.json says is compared, and a note
    # says what was not.
    older = {"plan": b["plan"], "run": {}}
    diffs, notes = condition_differences([a], [older])
    assert [d.key for d in diffs] == ["mbs", "env.NCCL_ALGO"]
    assert "conditions not recorded for every run" in notes[0]


def test_algorithm_variables_are_told_from_logging_ones():
    assert is_performance_env("NCCL_ALGO") and is_performance_env("NCCL_IB_HCA")
    assert is_performance_env("OMP_NUM_THREADS")
    assert not is_performance_env("NCCL_DEBUG") and not is_performance_env("NCCL_DEBUG_SUBSYS")
    assert not is_performance_env("TORCH_NCCL_ASYNC_ERROR_HANDLING")


# --- two real runs: NCCL_ALGO=Ring against none, MBS 2 against 1 ----------------------------

@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    ring = train(root, WORKLOAD, 1, "--env", "NCCL_ALGO=Ring", steps=4)
    mbs1 = train(root, WORKLOAD, 1, "--set", "mbs=1", steps=4)
    return root, ring, mbs1


def _window_mean(exp, first: int, last: int) -> tuple[float, int]:
    times = [r["step_time_s"] for r in read_metrics(exp) if first <= r["iteration"] <= last]
    return statistics.fmean(times), len(times)


@pytest.mark.slow
def test_compare_names_both_differences_and_the_gap(two_runs):
    root, ring, mbs1 = two_runs
    res = run_cli("compare", str(ring), str(mbs1), root=root)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    # 4 steps: the seeds' window 11-44 of 50 scales to iterations 1-3.
    mean_a, n_a = _window_mean(ring, 1, 3)
    mean_b, n_b = _window_mean(mbs1, 1, 3)
    assert (n_a, n_b) == (3, 3)
    step_row = next(line for line in out.splitlines() if "step time (s)" in line)
    assert f"{100 * (mean_b / mean_a - 1):+.1f}%" in step_row
    assert "3 steps 1-3" in step_row
    assert ("within noise (p=" in step_row) or ("OUTSIDE noise (p=" in step_row)
    assert "noise: Welch's t-test on the step times of the two timed windows" in out
    # The same work per step (GBS 8 of 128 tokens, one rank): tokens/s gets the step
    # time's verdict, not a second opinion.
    tokens_row = next(line for line in out.splitlines() if line.startswith("│ tokens/s  "))
    p_step = step_row.split("(p=")[1].split(")")[0]
    assert f"(p={p_step})" in tokens_row
    lines = out.splitlines()
    mbs_line = next(i for i, line in enumerate(lines) if "[plan] mbs: 2 (A) -> 1 (B)" in line)
    env_line = next(i for i, line in enumerate(lines)
                    if "[environment] NCCL_ALGO: Ring (A) -> unset (B)" in line)
    assert mbs_line < env_line  # the plan ranks before the environment

    res = run_cli("compare", str(ring), str(mbs1), "--format", "json", root=root)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    keys = [d["key"] for d in data["differences"]]
    # MBS 1 at the same global batch doubles the accumulation steps; nothing else in the
    # plan or the machine differs between the two runs.
    assert keys[:3] == ["mbs", "ga", "env.NCCL_ALGO"]
    assert all(not k.startswith(("version.", "gpu.", "host.", "cpu.")) for k in keys)
    ring_run = json.loads((ring / "run.json").read_text())
    assert ring_run["conditions"]["env"]["NCCL_ALGO"] == "Ring"  # what the ranks really had
    step = data["metrics"][0]
    assert step["metric"] == "step time"
    assert step["a"] == pytest.approx(mean_a) and step["b"] == pytest.approx(mean_b)
    assert step["diff_pct"] == pytest.approx(100 * (mean_b / mean_a - 1))
    noise = step["noise"]
    assert (noise["n_a"], noise["n_b"]) == (3, 3)
    assert 0 <= noise["p"] <= 1 and noise["ci95_low"] <= noise["diff"] <= noise["ci95_high"]
    assert noise["outside_noise"] == (noise["p"] < 0.05)


@pytest.mark.slow
def test_sets_are_tested_on_the_runs_own_figures(two_runs):
    _, ring, mbs1 = two_runs
    # The same two runs on both sides: no gap at all, and each side says its runs are
    # not repeats of one plan.
    a, b = load_side("A", [ring, mbs1]), load_side("B", [mbs1, ring])
    rows, method = metric_rows(a, b)
    assert method == METHOD_RUNS
    step = rows[0]
    assert step.diff_pct == pytest.approx(0.0, abs=1e-9)
    assert (step.test.n_a, step.test.n_b) == (2, 2) and step.test.outside_noise is False
    assert "(2 runs)" in step.a_text
    rows, method = metric_rows(load_side("A", [ring]), load_side("B", [mbs1]))
    assert method == METHOD_STEPS and rows[0].test.n_a == 3

    from trainbench.results.compare import compare
    notes = compare(a, b).notes
    assert any("A's runs differ in mbs" in n and "not repeats of one plan" in n for n in notes)


@pytest.mark.slow
def test_energy_and_throttling_from_the_telemetry(two_runs, tmp_path):
    """The real runs' directories, their run.json telemetry as GPU nodes would write it."""
    import shutil
    _, ring, mbs1 = two_runs
    copies = []
    for exp, energy, throttled in ((ring, 0.25, False), (mbs1, 0.2, True)):
        copy = shutil.copytree(exp, tmp_path / exp.name)
        run = json.loads((copy / "run.json").read_text())
        run["telemetry"].update(source="nvml", energy_per_token_j=energy, throttled=throttled,
                                throttle_reasons=["sw power cap"] if throttled else [])
        (copy / "run.json").write_text(json.dumps(run))
        copies.append(copy)
    from trainbench.results.compare import compare
    result = compare(load_side("A", [copies[0]]), load_side("B", [copies[1]]))
    energy = next(m for m in result.metrics if m.name == "energy per token")
    assert (energy.a, energy.b) == (0.25, 0.2)
    assert energy.diff_pct == pytest.approx(-20.0)
    assert energy.test is None and "no noise estimate" in energy.note
    assert [d.key for d in result.differences][:3] == ["mbs", "ga", "env.NCCL_ALGO"]
    throttled = [d for d in result.differences if d.key == "telemetry.throttled"]
    assert throttled and (throttled[0].a, throttled[0].b) == (False, True)
    assert any(n.startswith("B: ") and "throttled in its timed window" in n
               for n in result.notes)


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (["compare", str(tmp_path / "missing"), str(empty)], "does not exist"),
        (["compare", str(empty), str(empty)], "is not an experiment"),
        (["compare", str(empty)], "1 path(s) given"),
        (["compare", "--a", str(empty)], "side B is missing"),
        (["compare", str(empty), str(empty), "--format", "xml"], "unknown --format"),
    ]
    for args, expected in cases:
        res = run_cli(*args, root=tmp_path)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("trainbench: error: "), res.stderr
        assert expected in lines[0] and "Traceback" not in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]  # nothing written
