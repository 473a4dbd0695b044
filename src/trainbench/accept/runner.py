"""One `trainbench` command under its own time limit, its output kept in a log file.

Each command runs in a session of its own, so a command past its limit is stopped with
everything it started (the launcher, torchrun, the ranks): SIGTERM to the session's
process group, then SIGKILL to whatever is still there after a grace period. One hang
costs its own limit and nothing else.

Because that session is not the acceptance run's own, a signal that stops the acceptance
run (Ctrl-C, or SIGTERM from `timeout`, a batch system or a lease that ends) would leave
the running command behind, holding the GPU the next job gets. So while a command runs,
SIGTERM stops it too, as Ctrl-C does, before the acceptance run ends by the same signal;
and should the acceptance run be killed outright (SIGKILL, `timeout -k`), the kernel
sends the command SIGTERM (PR_SET_PDEATHSIG), which stops it the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..launch.local import stop_with_parent

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


class _Terminated(BaseException):
    """SIGTERM reached this process while a command ran."""


@contextlib.contextmanager
def _sigterm_raises():
    """SIGTERM raises _Terminated here (signal handlers live in the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum, frame):
        # Once: a second SIGTERM while the command is being stopped must not cut that short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_limited(cmd: list[str], log: Path, limit_s: float,
                stdout: Path | None = None) -> Finished:
    """Run `cmd` with its output in `log` (its stdout in `stdout` when given); stop it
    (and its children) after `limit_s` seconds, or when this process is interrupted or
    terminated, which then goes on to end as the signal says."""
    start = time.monotonic()
    terminated = False
    with open(log, "ab") as out, open(stdout or os.devnull, "wb") as data, _sigterm_raises():
        out.write(("$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        proc = subprocess.Popen(cmd, stdout=data if stdout else out, stderr=out,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=stop_with_parent(os.getpid()))
        try:
            code = proc.wait(timeout=limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            _stop(proc)
            code, timed_out = None, True
        except _Terminated:
            _stop(proc)
            code, timed_out, terminated = None, False, True
        except BaseException:  # Ctrl-C: take the command's processes down with us
            _stop(proc)
            raise
    if terminated:  # SIGTERM's own handler back, and the signal again: end as it asks
        os.kill(os.getpid(), signal.SIGTERM)
    return Finished(code=code, seconds=time.monotonic() - start, timed_out=timed_out, log=log)


def experiment_dir(root: Path) -> Path | None:
    """The newest experiment a `run --root ROOT` created, or None."""
    found = sorted(p.parent for p in root.glob("experiments/*/*/plan.json"))
    return max(found, key=lambda p: p.name) if found else None
