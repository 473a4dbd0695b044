"""jobs.sqlite written before the state_source column existed still opens and updates."""

from __future__ import annotations

import sqlite3

from trainbench.launch.jobs import JobsDB

OLD_SCHEMA = """
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, executor TEXT NOT NULL, job_id TEXT,
    name TEXT NOT NULL, exp_dir TEXT NOT NULL, plan_json TEXT NOT NULL, state TEXT NOT NULL,
    slurm_state TEXT, exit_code INTEGER, elapsed_s REAL, submitted REAL NOT NULL,
    updated REAL NOT NULL, results_json TEXT, note TEXT)
"""


def test_old_history_gains_state_source(tmp_path):
    with sqlite3.connect(tmp_path / "jobs.sqlite") as conn:
        conn.execute(OLD_SCHEMA)
        conn.execute("INSERT INTO jobs (executor, job_id, name, exp_dir, plan_json, state,"
                     " submitted, updated) VALUES ('slurm', '7', 'old', '/x', '{}', 'RUNNING',"
                     " 1, 1)")
    db = JobsDB(tmp_path)
    JobsDB(tmp_path)  # opening again finds the column and leaves it
    old = db.list()[0]
    assert (old["job_id"], old["state"], old["state_source"]) == ("7", "RUNNING", None)
    db.update(old["id"], state="COMPLETED", state_source="sacct")
    assert db.get(old["id"])["state_source"] == "sacct"
