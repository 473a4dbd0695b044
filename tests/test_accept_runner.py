"""The acceptance run's command runner: a command past its limit is stopped with what it
started, and so is a command whose acceptance run is itself stopped by SIGTERM (as
`timeout`, a batch system or a lease's end sends it), so no command outlives the run and
holds the GPU the next job gets. Real processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from trainbench.accept.runner import run_limited

# A command that records its pid and its child's, then outlives any test: what a probe or
# a training run launched by `accept` looks like to the runner.
SLEEPER = textwrap.dedent("""
    import subprocess, sys, time, pathlib
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    pathlib.Path(sys.argv[1]).write_text(f"{__import__('os').getpid()} {child.pid}")
    time.sleep(120)
""")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def wait_for(path: Path, seconds: float = 30.0) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def wait_gone(pids: list[int], seconds: float = 30.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def test_a_command_past_its_limit_is_stopped_with_its_children(tmp_path):
    pids = tmp_path / "pids"
    done = run_limited([sys.executable, "-c", SLEEPER, str(pids)], tmp_path / "log", 3.0)
    assert done.timed_out and done.code is None
    assert wait_gone([int(p) for p in pids.read_text().split()]) == []


def test_sigterm_to_the_run_stops_its_running_command_first(tmp_path):
    pids = tmp_path / "pids"
    # The acceptance run's side: run_limited in a process of its own, as `accept` runs it.
    runner = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from trainbench.accept.runner import run_limited
        run_limited([sys.executable, "-c", {SLEEPER!r}, {str(pids)!r}],
                    Path({str(tmp_path / "log")!r}), 600.0)
        print("returned")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", runner], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    command, child = (int(p) for p in wait_for(pids).split())
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err  # it ends as SIGTERM asks, no traceback
    assert "returned" not in out and "Traceback" not in err
    assert wait_gone([command, child]) == []
