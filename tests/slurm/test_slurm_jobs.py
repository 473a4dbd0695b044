"""trainbench on a real single-node Slurm: submit, finish, cancel, fail.

Each job is the tiny Llama on 2 CPU ranks: `trainbench run --executor slurm` renders the
script, sbatch queues it, srun starts one torchrun agent that runs 2 ranks with gloo.
States come back through `trainbench jobs refresh`: from squeue while a job runs, then
from sacct where the cluster has accounting (CI's does), else the job-completion file and
the job's own exit.json. With accounting, each finished job is also refreshed into a
fresh history row without exit.json, which sacct alone must settle the same way.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from slurm_helpers import (cancel, refresh_without_exit_record, submit_tiny, table_row,
                           trainbench, wait_for)

pytestmark = pytest.mark.slurm

STEP = re.compile(r"iteration (\d+)/(\d+) .*train_step_timing in s: ")


def assert_sacct_agrees(cluster, row: dict, tmp_path: Path) -> None:
    """With accounting, sacct alone (no exit.json) gives the row's state and exit code."""
    if not cluster.accounting:
        return  # test_slurm_accounting.py fails or skips for the missing accounting
    bare = refresh_without_exit_record(row["job_id"], tmp_path / "sacct-only")
    assert bare["state_source"] == "sacct", bare
    assert (bare["state"], bare["exit_code"]) == (row["state"], row["exit_code"]), bare
    assert bare["elapsed_s"] is not None


def step_lines(exp_dir: Path, name: str) -> list[int]:
    log = exp_dir / f"log-{name}.out"
    return [int(m.group(1)) for m in STEP.finditer(log.read_text())] if log.exists() else []


def test_plain_sbatch_job_runs(slurm_cluster, tmp_path):
    """The fixture's cluster runs an ordinary batch job (independent of trainbench)."""
    out = tmp_path / "hostname.out"
    job = subprocess.run(["sbatch", "--parsable", f"--output={out}", "--wrap", "hostname"],
                         capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    from trainbench.launch.jobs import JobsDB, refresh
    db = JobsDB(tmp_path)
    row = db.add("slurm", job, "wrap", str(tmp_path), "{}", "PENDING")
    deadline = time.monotonic() + 60
    while db.get(row)["state"] not in ("COMPLETED", "FAILED") and time.monotonic() < deadline:
        time.sleep(1)
        refresh(db, [row])
    assert db.get(row)["state"] == "COMPLETED" and db.get(row)["exit_code"] == 0
    assert out.read_text().strip()  # the node's hostname


@pytest.fixture(scope="module")
def completed_job(slurm_cluster, tmp_path_factory):
    """One tiny run through `trainbench run --executor slurm`, waited for to the end."""
    import yaml
    root = tmp_path_factory.mktemp("slurm-completed")
    (root / "cluster.yaml").write_text(yaml.safe_dump({"slurm": {"partition": "debug"},
                                                       "gpu_type": "cpu"}))
    patch = pytest.MonkeyPatch()
    patch.setenv("TRAINBENCH_ROOT", str(root))
    patch.setenv("TRAINBENCH_CONFIG", str(root / "cluster.yaml"))
    patch.delenv("TRAINBENCH_FAIL_AT_STEP", raising=False)
    try:
        job = submit_tiny(steps=5)
        try:
            row = wait_for(job["id"], lambda r: r["state"] in ("COMPLETED", "FAILED",
                                                              "CANCELLED", "TIMEOUT"),
                           timeout=240, what="finished")
        finally:
            cancel(job["job_id"])
        yield root, row
    finally:
        patch.undo()


def test_tiny_run_completes_under_srun_torchrun(completed_job, slurm_cluster, monkeypatch,
                                                tmp_path):
    root, row = completed_job
    monkeypatch.setenv("TRAINBENCH_ROOT", str(root))
    monkeypatch.setenv("TRAINBENCH_CONFIG", str(root / "cluster.yaml"))
    exp = Path(row["exp_dir"])
    name = row["name"]
    assert row["state"] == "COMPLETED", (exp / f"sbatch_{name}.out").read_text()
    assert row["exit_code"] == 0 and row["elapsed_s"] is not None
    # The job went through srun: slurmd launched step <job>.0 ...
    assert f"launch task StepId={row['job_id']}.0 " in slurm_cluster.slurmd_log.read_text()
    # ... which ran torchrun with 2 ranks that trained all 5 steps.
    script = (exp / f"sbatch_{name}.sh").read_text()
    assert "srun --kill-on-bad-exit=1" in script and "-m torch.distributed.run" in script
    assert json.loads((exp / "run.json").read_text())["world_size"] == 2
    assert step_lines(exp, name) == [0, 1, 2, 3, 4]
    assert json.loads((exp / "exit.json").read_text())["exit_code"] == 0

    listed = trainbench("jobs", "refresh")
    assert listed.returncode == 0, listed.stderr
    assert table_row(listed.stdout, row["job_id"])[4] == "COMPLETED"
    assert_sacct_agrees(slurm_cluster, row, tmp_path)


def test_results_show_success(completed_job, monkeypatch):
    root, row = completed_job
    try:
        from trainbench.results import summarize_experiment  # noqa: F401
    except ImportError:
        if __import__("os").environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("trainbench.results.summarize_experiment is missing")
        pytest.skip("trainbench.results is not written yet")
    monkeypatch.setenv("TRAINBENCH_ROOT", str(root))
    monkeypatch.setenv("TRAINBENCH_CONFIG", str(root / "cluster.yaml"))
    shown = trainbench("results", row["exp_dir"])
    assert shown.returncode == 0, shown.stderr
    assert "Success" in shown.stdout
    from trainbench.launch.jobs import JobsDB, refresh
    db = JobsDB(root)
    refresh(db, [row["id"]])
    assert db.get(row["id"])["results_json"], db.get(row["id"])["note"]


def test_cancelled_job_shows_cancelled_and_keeps_log(slurm_root, slurm_cluster):
    job = submit_tiny(steps=100_000)
    try:
        exp = Path(job["exp_dir"])
        # Cancel mid-training, once the first steps are in the log.
        wait_for(job["id"], lambda r: r["state"] == "RUNNING" and step_lines(exp, job["name"]),
                 timeout=120, what="training")
    finally:
        cancel(job["job_id"])
    row = wait_for(job["id"], lambda r: r["state"] not in ("PENDING", "RUNNING"),
                   timeout=60, what="ended")
    assert row["state"] == "CANCELLED"
    assert step_lines(exp, job["name"])  # the log is kept
    assert (exp / f"sbatch_{job['name']}.out").exists()
    listed = trainbench("jobs", "show", str(job["id"]))
    assert listed.returncode == 0 and "CANCELLED" in listed.stdout
    assert_sacct_agrees(slurm_cluster, row, slurm_root)


def test_killed_rank_shows_failed_and_keeps_log(slurm_root, slurm_cluster):
    # The engine SIGKILLs rank 1 at step 2, as a hardware fault would.
    job = submit_tiny("--env", "TRAINBENCH_FAIL_AT_STEP=2", "--env", "TRAINBENCH_FAIL_RANK=1",
                      steps=5)
    try:
        row = wait_for(job["id"], lambda r: r["state"] not in ("PENDING", "RUNNING"),
                       timeout=180, what="ended")
    finally:
        cancel(job["job_id"])
    exp = Path(job["exp_dir"])
    assert row["state"] == "FAILED", row
    assert row["exit_code"] not in (None, 0)
    steps = step_lines(exp, job["name"])
    assert steps and 4 not in steps  # trained, then died before the end; log kept
    assert json.loads((exp / "exit.json").read_text())["exit_code"] != 0
    listed = trainbench("jobs", "list")
    assert table_row(listed.stdout, job["job_id"])[4] == "FAILED"
    assert_sacct_agrees(slurm_cluster, row, slurm_root)


def test_bulk_submits_each_run_as_its_own_job(slurm_root):
    from trainbench.launch.jobs import JobsDB
    sweep = slurm_root / "sweep.yaml"
    sweep.write_text("executor: slurm\n"
                     "defaults: {steps: 2, slurm: {time_limit: '00:05:00'}}\n"
                     "tasks:\n"
                     "  - {workload: pretrain_llama3.1, size: tiny, dtype: bf16, scale: 2,"
                     " repeats: 2, env: {NOTE: 'a $(b)'}}\n")
    proc = trainbench("bulk", str(sweep))
    jobs = JobsDB(slurm_root).list()
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "submitted 2 Slurm job(s)" in proc.stdout
        assert len(jobs) == 2 and jobs[0]["job_id"] != jobs[1]["job_id"]
        assert jobs[0]["exp_dir"] != jobs[1]["exp_dir"]
        for job in jobs:
            exp = Path(job["exp_dir"])
            plan = json.loads((exp / "plan.json").read_text())
            assert plan["out_dir"] == str(exp) and plan["steps"] == 2
            assert "#SBATCH --time=00:05:00" in (exp / f"sbatch_{job['name']}.sh").read_text()
        queued = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                                timeout=30).stdout.split()
        assert {j["job_id"] for j in jobs} <= set(queued) | finished_ids(jobs)
    finally:
        for job in jobs:
            cancel(job["job_id"])


def finished_ids(jobs) -> set[str]:
    """Jobs that already ended (a fast machine may finish a 2-step run at once)."""
    from trainbench.launch.jobs import JobsDB, refresh
    db = JobsDB(Path(jobs[0]["exp_dir"]).parents[2])
    refresh(db)
    return {j["job_id"] for j in db.list() if j["state"] not in ("PENDING", "RUNNING")}


def test_refused_submission_leaves_nothing(slurm_root):
    sweep = slurm_root / "sweep.yaml"
    sweep.write_text("executor: slurm\n"
                     "tasks:\n"
                     "  - {workload: pretrain_llama3.1, size: tiny, dtype: bf16, scale: 2,"
                     " slurm: {partition: no-such-partition}}\n")
    proc = trainbench("bulk", str(sweep))
    assert proc.returncode == 1
    assert proc.stderr.startswith("trainbench: error: run 1 was not submitted: sbatch refused")
    assert "partition" in proc.stderr
    assert not list((slurm_root / "experiments").glob("*/*"))
    from trainbench.launch.jobs import JobsDB
    assert JobsDB(slurm_root).list() == []
