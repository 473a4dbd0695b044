"""The engine with real gloo processes under torchrun."""

import json
import os
import subprocess
import time

import pytest

from helpers import experiment_dirs, losses, processes_naming, read_metrics, run_cli, train

pytestmark = pytest.mark.dist

# fp32 on a CPU: the data-parallel run differs from one process only in the order of
# floating-point sums (gradient reduce-scatter), so losses agree to about 1e-6.
PARITY_RTOL = 1e-5


def test_fsdp_two_ranks_match_one_process(tmp_path):
    one = losses(train(tmp_path, "pretrain_llama3.1", 1, steps=4))
    two = losses(train(tmp_path, "pretrain_llama3.1", 2, steps=4))
    assert len(one) == len(two) == 4
    assert two == pytest.approx(one, rel=PARITY_RTOL)
    assert one[-1] < one[0]  # it really trains


def test_run_writes_log_metrics_and_never_overwrites(tmp_path):
    first = train(tmp_path, "pretrain_nemotron4", 1, steps=2)
    second = train(tmp_path, "pretrain_nemotron4", 1, steps=2)
    assert first != second and first.parent == second.parent
    log = (first / "log-pretrain_nemotron4_tiny_fp32_gpus1.out").read_text()
    steps = [line for line in log.splitlines() if "train_step_timing in s:" in line]
    assert len(steps) == 2 and "iteration 1/1" in steps[-1]
    records = read_metrics(first)
    assert [r["iteration"] for r in records] == [0, 1]
    assert all(r["step_time_s"] > 0 and r["consumed_samples"] == 8 * (r["iteration"] + 1)
               for r in records)
    run_info = json.loads((first / "run.json").read_text())
    assert run_info["peak_source"] == "measured GEMM" and run_info["peak_tflops"] > 0
    assert json.loads((first / "exit.json").read_text())["exit_code"] == 0



@pytest.mark.slow
def test_killed_rank_ends_the_job_with_a_clear_message(tmp_path):
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "tiny", "--dtype", "fp32", "--scale",
                  "2", "--steps", "20", "--gpu", "cpu", root=tmp_path, timeout=900,
                  env={"TRAINBENCH_FAIL_AT_STEP": "2", "TRAINBENCH_FAIL_RANK": "1"})
    assert res.returncode == 1
    # Rank 0 dies of the broken connection too, sometimes before torchrun looks; the
    # cause is still rank 1, and the terminal shows neither traceback nor gloo's error.
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("trainbench: error: run failed: rank 1 failed (killed by SIGKILL)")
    terminal = res.stdout + res.stderr
    assert "Traceback" not in terminal and "Connection reset" not in terminal
    (exp,) = experiment_dirs(tmp_path)
    log = (exp / "log-pretrain_llama3.1_tiny_fp32_gpus2.out").read_text()
    assert "iteration 1/19" in log  # the partial log is kept
    assert "trainbench: job failed: rank 1 failed (killed by SIGKILL)" in log
    assert "ChildFailedError" in log  # torchrun's report went to the log
    exit_record = json.loads((exp / "exit.json").read_text())
    assert exit_record["exit_code"] == res.returncode
    summary = json.loads(run_cli("results", str(exp), "--format", "json").stdout)
    assert summary["experiments"][0]["status"] == "Failed"
    assert processes_naming(str(exp)) == []  # no orphan rank


def test_bad_run_input_is_one_line(tmp_path):
    for args, needle in [
        (["--scale", "3"], "scales: 1, 2, 4"),
        (["--scale", "2", "--set", "tp"], "KEY=VALUE"),
        (["--scale", "2", "--dtype", "bf16", "--set", "fp8_recipe=rowwise"],
         "applies only to --dtype fp8"),
        (["--scale", "2", "--env", "A B=1"], "--env"),
        (["--scale", "2", "--load-checkpoint", "/nonexistent"], "no such directory"),
    ]:
        res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "tiny", "--gpu", "cpu", *args,
                      root=tmp_path)
        assert res.returncode == 2, (args, res.stderr)
        assert needle in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "experiments").exists()  # nothing half-written


@pytest.mark.slow
def test_killing_the_launcher_stops_every_rank(tmp_path):
    """SIGTERM (or a closed terminal's SIGHUP) to `trainbench run` stops the ranks too."""
    import signal
    import sys

    env = dict(os.environ, TRAINBENCH_ROOT=str(tmp_path),
               TRAINBENCH_CONFIG=str(tmp_path / "cluster.yaml"))
    proc = subprocess.Popen([sys.executable, "-m", "trainbench.cli", "run", "-w",
                             "pretrain_llama3.1", "-s", "tiny", "--dtype", "fp32", "--scale", "2",
                             "--gpu", "cpu", "--steps", "500"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    exp = None
    while time.time() < deadline:
        found = experiment_dirs(tmp_path) if (tmp_path / "experiments").exists() else []
        if found and len(read_metrics(found[0])) >= 2:
            exp = found[0]
            break
        time.sleep(0.5)
    assert exp is not None, "the run never logged two steps"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=600)
    record = json.loads((exp / "exit.json").read_text())
    # The launcher ends as it records it ended: 128 + SIGTERM.
    assert proc.returncode == record["exit_code"] == 128 + signal.SIGTERM
    assert "interrupted by SIGTERM" in record["reason"]
    assert "interrupted by SIGTERM" in stderr.strip().splitlines()[-1]
    assert "Traceback" not in stderr
    summary = json.loads(run_cli("results", str(exp), "--format", "json").stdout)
    assert summary["experiments"][0]["status"] == "Failed"
    deadline = time.monotonic() + 120  # a bound only: the ranks are normally gone already
    while processes_naming(str(exp)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_naming(str(exp)) == []  # no rank outlived the launcher
