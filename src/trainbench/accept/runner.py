"""One `trainbench` command under its own time limit, its output kept in a log file.

Each command runs in a session of its own, so a command past its limit is stopped with
everything it started (the launcher, torchrun, the ranks): SIGTERM to the session's
process group, then SIGKILL to whatever is still there after a grace period. One hang
costs its own limit and nothing else.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

GRACE_S = 15.0
"""How long a stopped command has to write its records (the launcher writes exit.json
on SIGTERM) before it is killed."""


@dataclass(frozen=True)
class Finished:
    code: int | None
    """The command's exit code; None when it was stopped at its limit."""
    seconds: float
    timed_out: bool
    log: Path


def trainbench_command(*args: str) -> list[str]:
    """`trainbench ARGS` with this interpreter, as the acceptance run's own."""
    return [sys.executable, "-m", "trainbench.cli", *args]


def _stop(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, GRACE_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_limited(cmd: list[str], log: Path, limit_s: float,
                stdout: Path | None = None) -> Finished:
    """Run `cmd` with its output in `log` (its stdout in `stdout` when given); stop it
    (and its children) after `limit_s` seconds."""
    start = time.monotonic()
    with open(log, "ab") as out, open(stdout or os.devnull, "wb") as data:
        out.write(("$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        proc = subprocess.Popen(cmd, stdout=data if stdout else out, stderr=out,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = proc.wait(timeout=limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            _stop(proc)
            code, timed_out = None, True
        except BaseException:  # Ctrl-C: take the command's processes down with us
            _stop(proc)
            raise
    return Finished(code=code, seconds=time.monotonic() - start, timed_out=timed_out, log=log)


def experiment_dir(root: Path) -> Path | None:
    """The newest experiment a `run --root ROOT` created, or None."""
    found = sorted(p.parent for p in root.glob("experiments/*/*/plan.json"))
    return max(found, key=lambda p: p.name) if found else None
