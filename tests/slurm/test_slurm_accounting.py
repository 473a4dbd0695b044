"""Job history from real Slurm accounting: slurmdbd + MariaDB, asked through sacct.

Each job here is a plain `sbatch --wrap` whose outcome is known in advance (a clean
end, an exit code, a SIGKILL, a cancel), so states, exit codes and elapsed times can be
checked exactly. The history rows point at directories without exit.json, and each row
records which source settled it: the state must come from sacct, not from the
job-completion file, scontrol or the job's own record.
"""

from __future__ import annotations

import subprocess
import time

import pytest
from slurm_helpers import cancel, refresh_without_exit_record, sacct_final

pytestmark = pytest.mark.slurm


def sbatch_wrap(command: str, tmp_path) -> str:
    out = tmp_path / "wrap-%j.out"
    return subprocess.run(["sbatch", "--parsable", f"--output={out}", "--wrap", command],
                          capture_output=True, text=True, timeout=30,
                          check=True).stdout.strip()


def wait_running(job_id: str, seconds_running: float, timeout: float = 60) -> None:
    """Until squeue shows the job RUNNING, then seconds_running more."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = subprocess.run(["squeue", "-h", f"--jobs={job_id}", "-o", "%T"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        if state == "RUNNING":
            time.sleep(seconds_running)
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not start in {timeout:.0f} s")


def test_sacct_is_the_cluster_accounting(slurm_accounting):
    """The cluster is registered in slurmdbd under slurm.conf's ClusterName."""
    clusters = subprocess.run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"],
                              capture_output=True, text=True, timeout=30, check=True)
    name = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                          timeout=30, check=True).stdout
    cluster = next(line.split("=", 1)[1].strip() for line in name.splitlines()
                   if line.split("=", 1)[0].strip() == "ClusterName")
    assert cluster in clusters.stdout.split()


def test_refresh_takes_completed_failed_cancelled_from_sacct(slurm_accounting, tmp_path):
    jobs = {
        "completed": sbatch_wrap("sleep 2", tmp_path),
        "exit 3": sbatch_wrap("exit 3", tmp_path),
        "killed": sbatch_wrap("kill -KILL $$", tmp_path),
        "cancelled": sbatch_wrap("sleep 300", tmp_path),
    }
    try:
        wait_running(jobs["cancelled"], seconds_running=2)
    finally:
        cancel(jobs["cancelled"])
    rows = {what: refresh_without_exit_record(job_id, tmp_path / "history")
            for what, job_id in jobs.items()}

    for what, row in rows.items():
        assert row["state_source"] == "sacct", (what, row)
        # No exit.json to fall back on: exit code and elapsed are sacct's too.
        assert row["exit_code"] is not None and row["elapsed_s"] is not None, (what, row)
        record = sacct_final(row["job_id"])
        assert (row["slurm_state"], row["exit_code"], row["elapsed_s"]) == (
            record["slurm_state"], record["exit_code"], record["elapsed_s"]), what

    assert rows["completed"]["state"] == "COMPLETED"
    assert rows["completed"]["exit_code"] == 0
    # sacct counts whole seconds; the job slept 2 s (a loaded machine may add some).
    assert 2 <= rows["completed"]["elapsed_s"] <= 30
    assert rows["exit 3"]["state"] == "FAILED" and rows["exit 3"]["exit_code"] == 3
    # Killed by signal 9: the shell's 128 + 9.
    assert rows["killed"]["state"] == "FAILED" and rows["killed"]["exit_code"] == 137
    assert rows["cancelled"]["state"] == "CANCELLED"
    assert rows["cancelled"]["slurm_state"].startswith("CANCELLED")
    assert rows["cancelled"]["elapsed_s"] >= 2  # it ran before the cancel


def test_a_running_job_is_not_settled_by_accounting(slurm_accounting, tmp_path):
    """While squeue lists the job, the row says RUNNING from squeue, whatever sacct has."""
    from trainbench.launch.jobs import JobsDB, refresh
    job_id = sbatch_wrap("sleep 300", tmp_path)
    try:
        wait_running(job_id, seconds_running=0)
        db = JobsDB(tmp_path)
        row = db.add("slurm", job_id, "running", str(tmp_path), "{}", "PENDING")
        refresh(db, [row])
        assert (db.get(row)["state"], db.get(row)["state_source"]) == ("RUNNING", "squeue")
    finally:
        cancel(job_id)
