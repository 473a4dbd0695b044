"""The job history of local runs whose launcher is gone."""

import subprocess
import sys

from trainbench.launch.jobs import JobsDB, refresh


def test_local_job_of_a_dead_launcher_without_exit_record_becomes_failed(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer runs
    # A process whose command line names trainbench stands for a live launcher.
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "trainbench"])
    try:
        exp = tmp_path / "experiments" / "x" / "x_1"
        exp.mkdir(parents=True)
        db = JobsDB(tmp_path)
        gone = db.add("local", str(dead.pid), "x", str(exp), "{}", "RUNNING")
        running = db.add("local", str(live.pid), "x", str(exp), "{}", "RUNNING")
        refresh(db, [gone, running])
        assert db.get(gone)["state"] == "FAILED"
        assert "without an exit record" in db.get(gone)["note"]
        assert db.get(running)["state"] == "RUNNING"
    finally:
        live.kill()
        live.wait()
