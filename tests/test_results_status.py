"""One truth about a run's status (issue 37): a run still going is Running, never Failed
and never in the success rate; a non-finite or non-positive step time makes a run
Invalid; a non-zero exit code is never a Success; an MFU note never shows nan, inf or a
negative figure.

Run directories are written here as trainbench writes them (plan.json from a real plan,
metrics.jsonl, launcher.json naming a real live or dead process, the job history through
JobsDB); the statuses come from summarize_experiment and the real CLI.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_cli
from trainbench.rundir import process_start_ticks
from trainbench.launch.jobs import JobsDB
from trainbench.metrics import mfu_problem
from trainbench.planning import build_plan
from trainbench.results import summarize_experiment
from trainbench.results.report import summary, summary_line
from trainbench.results.status import FAILED, INVALID, RUNNING, SUCCESS


def run_dir(root: Path, steps_logged: int, steps: int = 10, step_time=0.5,
            name: str = "run") -> Path:
    """<root>/experiments/<plan>/<name>: plan.json of a real tiny plan, and metrics.jsonl
    with the first steps_logged steps (step_time: a number, or a function of the step)."""
    plan = build_plan("pretrain_llama3.1", "tiny", "fp32", 1, "cpu", steps=steps)
    exp = root / "experiments" / plan.name / name
    exp.mkdir(parents=True)
    (exp / "plan.json").write_text(plan.to_json())
    rows = []
    for i in range(steps_logged):
        t = step_time(i) if callable(step_time) else step_time
        rows.append(json.dumps({"iteration": i, "step_time_s": t if math.isfinite(t) else str(t),
                                "loss": 3.0, "total_iterations": steps}))
    (exp / "metrics.jsonl").write_text("".join(r + "\n" for r in rows))
    return exp


def launcher(exp: Path, pid: int) -> None:
    """The launcher record `trainbench run` writes (trainbench/rundir.py)."""
    (exp / "launcher.json").write_text(json.dumps({"pid": pid,
                                                   "start_ticks": process_start_ticks(pid)}))


@pytest.fixture
def live_process():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


# --- a run in progress -------------------------------------------------------------------------

def test_a_run_whose_launcher_lives_is_running_not_failed(tmp_path, live_process):
    exp = run_dir(tmp_path, steps_logged=0)
    launcher(exp, live_process.pid)
    r = summarize_experiment(exp)
    assert r.status == RUNNING and r.verdict == "running"
    assert r.status_detail == "in progress (its launcher is still running): no step logged yet"
    (exp / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "step_time_s": 0.5}) + "\n")
    r = summarize_experiment(exp)
    assert r.status == RUNNING and r.status_detail.endswith("1 step(s) logged, the last "
                                                            "iteration 0")
    # Once the launcher has ended without exit.json, the run was killed: Failed.
    live_process.kill()
    live_process.wait()
    r = summarize_experiment(exp)
    assert r.status == FAILED and "launcher killed" in r.status_detail


def test_a_job_the_history_says_is_running_is_running(tmp_path):
    """A Slurm job records no launcher: its job history's state decides, until the job's
    script writes exit.json."""
    exp = run_dir(tmp_path, steps_logged=3)
    db = JobsDB(tmp_path)
    job = db.add("slurm", "4242", exp.parent.name, str(exp), "{}", "RUNNING")
    r = summarize_experiment(exp)
    assert (r.status, r.status_detail) == (
        RUNNING, "in progress (the job history says RUNNING): 3 step(s) logged, the last "
                 "iteration 2")
    db.update(job, state="PENDING")
    assert summarize_experiment(exp).status == RUNNING
    (exp / "exit.json").write_text(json.dumps({"exit_code": 1, "reason": "node failure"}))
    assert summarize_experiment(exp).status == FAILED
    (exp / "exit.json").unlink()
    db.update(job, state="FAILED")
    assert summarize_experiment(exp).status != RUNNING


def test_a_local_job_whose_launcher_died_is_not_running(tmp_path):
    """A local job's row says RUNNING until it is settled; a launcher that no longer runs
    (here: a finished process, no launcher.json) leaves no run in progress."""
    exp = run_dir(tmp_path, steps_logged=3)
    dead = subprocess.Popen(["true"])
    dead.wait()
    JobsDB(tmp_path).add("local", str(dead.pid), exp.parent.name, str(exp), "{}", "RUNNING")
    assert summarize_experiment(exp).status != RUNNING


def test_running_runs_are_out_of_the_success_rate(tmp_path, live_process):
    done = run_dir(tmp_path, steps_logged=10, name="done")
    (done / "exit.json").write_text(json.dumps({"exit_code": 0, "reason": "completed"}))
    going = run_dir(tmp_path, steps_logged=4, name="going")
    launcher(going, live_process.pid)
    results = [summarize_experiment(done), summarize_experiment(going)]
    assert [r.status for r in results] == [SUCCESS, RUNNING]
    counts = summary(results)
    assert (counts["success_rate_pct"], counts["running"]) == (100.0, 1)
    assert summary_line(results) == ("2 experiment(s): 1 Success, 0 Incomplete, 0 Failed, "
                                     "0 Invalid, 1 Running; success rate 100% (1/1 ended); "
                                     "MFU convention: published")
    res = run_cli("results", str(tmp_path / "experiments"), "--format", "json")
    data = json.loads(res.stdout)
    assert data["summary"]["running"] == 1 and data["summary"]["success_rate_pct"] == 100.0


# --- step times that mean nothing ------------------------------------------------------------------

@pytest.mark.parametrize("bad,shown", [(math.nan, "nan"), (math.inf, "inf"), (-0.5, "-0.5"),
                                       (0.0, "0.0")])
def test_a_step_time_that_is_not_a_positive_number_makes_the_run_invalid(tmp_path, bad, shown):
    exp = run_dir(tmp_path, steps_logged=10, step_time=lambda i: bad if i == 7 else 0.5)
    (exp / "exit.json").write_text(json.dumps({"exit_code": 0, "reason": "completed"}))
    r = summarize_experiment(exp)
    assert r.status == INVALID and r.verdict == "invalid" and r.step_time_mean_s is None
    assert r.status_detail == f"step time is {shown} at iteration 7: the timings mean nothing"


def test_a_nan_step_time_in_a_nemo_log_is_invalid(tmp_path):
    lines = [f"Training epoch 0, iteration {i}/9 | reduced_train_loss: 3.0 | "
             f"train_step_timing in s: {'nan' if i == 4 else '1.5'} | consumed_samples: 8"
             for i in range(10)]
    log = tmp_path / "log-nemo.out"
    log.write_text("\n".join(lines) + "\n")
    r = summarize_experiment(log)
    assert r.status == INVALID and r.status_detail.startswith("step time is nan at iteration 4")


# --- exit codes and MFU notes ------------------------------------------------------------------------

def test_a_nonzero_exit_code_is_never_a_success(tmp_path):
    exp = run_dir(tmp_path, steps_logged=10)
    (exp / "exit.json").write_text(json.dumps({"exit_code": 1, "reason": "rank 0 failed"}))
    r = summarize_experiment(exp)
    assert r.status == FAILED and r.verdict == "failed"
    assert r.status_detail == "exit code 1 after the last step: rank 0 failed"
    assert summary([r])["success_rate_pct"] == 0.0


@pytest.mark.parametrize("peak", ["nan", "-inf", -300, "fast"])
def test_a_peak_that_is_no_positive_number_gives_no_mfu_and_a_plain_note(tmp_path, peak):
    exp = run_dir(tmp_path, steps_logged=10)
    (exp / "exit.json").write_text(json.dumps({"exit_code": 0, "reason": "completed"}))
    (exp / "run.json").write_text(json.dumps({"peak_tflops": peak, "peak_source": "measured"}))
    r = summarize_experiment(exp)
    assert r.status == SUCCESS and r.mfu_pct is None and r.mfu_invalid_pct is None
    assert "run.json peak_tflops is not a positive number: no MFU" in r.notes
    for note in r.notes:
        assert not any(word in note.lower() for word in ("nan", "inf", "-300")), note


@pytest.mark.parametrize("mfu", [math.nan, math.inf, -math.inf, -12.5, 150.0])
@pytest.mark.parametrize("peak", [989.0, math.nan, -1.0, 0.0])
def test_an_mfu_note_never_shows_nan_inf_or_a_negative_figure(mfu, peak):
    line = mfu_problem(mfu, peak, "catalog")
    assert line.startswith("INVALID: MFU ") and "--peak-tflops" in line
    assert not any(word in line.lower() for word in ("nan", "inf ", "-12.5", "-1 ", "-inf"))
    if mfu == 150.0 and peak == 989.0:
        assert "MFU 150% of 989 TFLOPS (catalog) is above 100%" in line
