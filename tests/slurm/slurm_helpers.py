"""Helpers for the real-Slurm tests: run the CLI, submit the tiny workload, wait."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def trainbench(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """`trainbench ARGS` as a user runs it, in the current (test) environment."""
    return subprocess.run([sys.executable, "-m", "trainbench.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def submit_tiny(*extra: str, steps: int = 5) -> dict:
    """`trainbench run` of the tiny Llama on 2 ranks through Slurm; its jobs.sqlite row."""
    from trainbench.launch.jobs import JobsDB
    proc = trainbench("run", "-w", "pretrain_llama3.1", "-s", "tiny", "--dtype", "bf16",
                      "--scale", "2", "--steps", str(steps), "--gpu", "cpu",
                      "--executor", "slurm", *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jobs = JobsDB(Path(os.environ["TRAINBENCH_ROOT"])).list()
    assert jobs, "the submission was not recorded in jobs.sqlite"
    return jobs[-1]


def wait_for(job_row_id: int, predicate, timeout: float, what: str) -> dict:
    """Refresh the job (as `trainbench jobs refresh` does) until predicate(row) holds."""
    from trainbench.launch.jobs import JobsDB, refresh
    db = JobsDB(Path(os.environ["TRAINBENCH_ROOT"]))
    deadline = time.monotonic() + timeout
    while True:
        refresh(db, [job_row_id])
        row = db.get(job_row_id)
        if predicate(row):
            return row
        if time.monotonic() > deadline:
            raise AssertionError(f"job {row['job_id']} not {what} after {timeout:.0f} s: {row}")
        time.sleep(1)


def cancel(job_id: str) -> None:
    subprocess.run(["scancel", job_id], capture_output=True, timeout=30)


def table_row(stdout: str, job_id: str) -> list[str]:
    """The cells of the `trainbench jobs` table row whose 'job id' column is job_id."""
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.split("\u2502")[1:-1]]
        if len(cells) >= 5 and cells[2] == job_id:
            return cells
    raise AssertionError(f"job {job_id} is not in the table:\n{stdout}")


def sacct_final(job_id: str, timeout: float = 30) -> dict:
    """sacct's record of a job once it shows a final state (accounting may lag a moment)."""
    from trainbench.launch.jobs import FINAL, normalise_state, sacct_record
    deadline = time.monotonic() + timeout
    while True:
        record = sacct_record(job_id)
        if record and normalise_state(record["slurm_state"]) in FINAL:
            return record
        if time.monotonic() > deadline:
            raise AssertionError(f"sacct has no final state for job {job_id} after "
                                 f"{timeout:.0f} s: {record}")
        time.sleep(0.5)


def refresh_without_exit_record(job_id: str, root: Path) -> dict:
    """A new history row for a finished Slurm job whose directory holds no exit.json,
    refreshed once: what `trainbench jobs refresh` makes of it from Slurm alone."""
    from trainbench.launch.jobs import JobsDB, refresh
    sacct_final(job_id)
    bare = root / f"bare-{job_id}"
    bare.mkdir(parents=True)
    db = JobsDB(root)
    row = db.add("slurm", job_id, f"bare-{job_id}", str(bare), "{}", "PENDING")
    refresh(db, [row])
    return db.get(row)
