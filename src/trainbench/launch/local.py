"""The local executor: torchrun on this machine, one process per rank.

torchrun's agent watches the ranks: when one dies it stops the others, so a crash ends
the whole job. The launcher runs torchrun in its own session and kills that whole group
on interruption, so no rank outlives the command. A launcher killed with SIGKILL cannot
do that: torchrun then gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and stops the
ranks, and each rank dies with torchrun the same way (engine/__main__.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn,
                           TimeRemainingColumn)

from ..plan import Plan
from ..rundir import EXIT_FILE, PLAN_FILE, log_file_name, write_launcher_record
from .rank_env import NCCL_TRACE, rank_additions

# The engine's step line, read one field at a time: a single pattern with `.*` between
# the fields costs time quadratic in a long line that repeats `iteration N/M `.
_STEP_ITERATION = re.compile(r"iteration (\d+)/(\d+) ")
_STEP_LOSS = re.compile(r"reduced_train_loss: (\S+) ")
_STEP_TIME = re.compile(r"train_step_timing in s: (\S+)")


def step_fields(text: str) -> tuple[str, str, str, str] | None:
    """(iteration, last iteration, loss, step time) of an engine step line, else None."""
    it = _STEP_ITERATION.search(text)
    if it is None:
        return None
    loss = _STEP_LOSS.search(text, it.end())
    step = _STEP_TIME.search(text, loss.end()) if loss else None
    return (it.group(1), it.group(2), loss.group(1), step.group(1)) if step else None
# torchrun prints these on every multi-process start; they are not the user's concern.
_NOISE = ("Setting OMP_NUM_THREADS environment variable", "*****")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_command(plan: Plan, plan_path: Path) -> list[str]:
    launcher = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc-per-node={plan.gpus}", "--nnodes=1",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        # torchrun's default: the agent sees a finished or failed rank within 0.1 s (at 1 s,
        # every run waited half a second on average after its last rank had exited).
        "--max-restarts=0", "--monitor-interval=0.1",
    ]
    if plan.features.profile == "nsys":
        # torchrun starts `nsys profile python -m trainbench.engine ...` per rank.
        return launcher + ["--no-python", *nsys_prefix(plan_path.parent), sys.executable,
                           "-m", "trainbench.engine", str(plan_path)]
    return launcher + ["-m", "trainbench.engine", str(plan_path)]


def nsys_prefix(exp_dir: Path) -> list[str]:
    """Nsight Systems around one rank, recording only between the engine's
    cudaProfilerStart/Stop (the profiled steps); one report per rank."""
    return ["nsys", "profile", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
            "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none",
            f"--output={exp_dir / 'profile' / 'nsys-rank%q{RANK}'}", "--force-overwrite=false"]


def rank_environment(plan: Plan) -> dict[str, str]:
    env = dict(os.environ)
    env.update(dict(plan.env))
    if plan.device == "cpu":
        # One thread per rank: ranks share this machine's cores.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // plan.gpus)))
    if plan.features.nccl_trace:
        env.update(NCCL_TRACE)
    env.update(rank_additions(plan, env))
    return env


class Progress:
    """A rich progress bar on a terminal; plain lines otherwise (CI, pipes, files)."""

    def __init__(self, total: int, interactive: bool):
        self.interactive = interactive
        self.bar = None
        self.first: int | None = None  # first iteration seen
        if interactive:
            self.bar = RichProgress(TextColumn("training"), BarColumn(), MofNCompleteColumn(),
                                    TextColumn("{task.fields[info]}"), TimeRemainingColumn())
            self.task = self.bar.add_task("train", total=total, info="")
            self.bar.start()

    def line(self, text: str) -> None:
        match = step_fields(text)
        if self.bar is None:
            print(text, flush=True)
            return
        if match:
            it, _, loss, step_time = match
            # A resumed run starts at its checkpoint's iteration, not at 0.
            if self.first is None:
                self.first = int(it)
            self.bar.update(self.task, completed=int(it) - self.first + 1,
                            info=f"loss {loss}  step {float(step_time):.3f}s")
        elif not any(noise in text for noise in _NOISE):
            self.bar.console.print(text, markup=False, highlight=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


class Interrupts:
    """SIGINT, SIGTERM and SIGHUP while a local run is under way, from the creation of its
    experiment until its records (exit.json, the job's row) are written.

    While the ranks run, the first signal raises KeyboardInterrupt(signum) at once. Any
    signal outside that stretch (while the experiment is being created, while the ranks
    are being stopped, while the records are written) is held: it is noted, a held first
    signal interrupts the run as soon as it is armed (so a run stopped before its ranks
    start still writes its exit record), and a later one (a second Ctrl-C 0.3 s after the
    first) only hurries the stop, killing the ranks' process group with SIGKILL. No signal
    ever cuts the records short."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.signum: int | None = None
        """The first signal received."""
        self.group: int | None = None
        """The ranks' process group (torchrun's session), once it exists."""
        self._previous: dict = {}

    def __enter__(self) -> "Interrupts":
        if threading.current_thread() is threading.main_thread():  # handlers live there
            self._previous = {sig: signal.signal(sig, self._hold) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> bool:
        # A run that was signalled is on its way out (its records written, then its
        # summary, the error line and exit 130): a later signal is ignored to the end,
        # interpreter teardown included (which resets Python's own handlers to the
        # default, so a held one would then end the launcher by the signal instead of
        # with the recorded exit code).
        if self.signum is None:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
        else:
            self._install(signal.SIG_IGN)
        self._previous = {}
        return False

    def arm(self) -> None:
        """The run starts: a signal now interrupts it, and one already held does at once."""
        if self.signum is not None:
            raise KeyboardInterrupt(self.signum)
        self._install(self._interrupt)

    def hold(self) -> None:
        self._install(self._hold)

    def _install(self, handler) -> None:
        for sig in self._previous:
            signal.signal(sig, handler)

    def _interrupt(self, signum, frame):
        self.signum = signum
        self.hold()
        raise KeyboardInterrupt(signum)

    def _hold(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
        if self.group is not None:
            try:
                os.killpg(self.group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def run_local(plan: Plan, exp_dir: Path, interactive: bool | None = None,
              interrupts: Interrupts | None = None) -> int:
    """Run the plan with torchrun; returns its exit code and writes exit.json.

    The exit code is the one the launcher itself ends with: torchrun's, or 128 + the
    signal that interrupted the launcher (130 for Ctrl-C, 143 for SIGTERM). interrupts:
    the caller's guard (Interrupts), when it holds signals past the run (finish_local);
    else the run holds them itself until exit.json is written.
    """
    with contextlib.ExitStack() as stack:
        guard = interrupts if interrupts is not None else stack.enter_context(Interrupts())
        return _run_guarded(plan, exp_dir, interactive, guard)


def _run_guarded(plan: Plan, exp_dir: Path, interactive: bool | None,
                 guard: Interrupts) -> int:
    plan_path = exp_dir / PLAN_FILE
    if plan.features.profile == "nsys":
        (exp_dir / "profile").mkdir(exist_ok=True)
    if interactive is None:
        interactive = sys.stdout.isatty()
    started = time.time()
    write_launcher_record(exp_dir)
    reserve = _reserve_space(exp_dir)
    log_path = exp_dir / log_file_name(plan.name)
    progress = Progress(plan.steps, interactive)
    stream = RankOutput(progress, log_path, announcement=f"trainbench: {plan.name} on ")
    interrupted: int | None = None
    proc = None
    # torchrun runs in its own session (so a Ctrl-C reaches only this launcher, which then
    # stops the ranks in order); a closed terminal or a kill must stop them the same way.
    try:
        # Started while signals are held, so no signal can land between the fork and the
        # group's record; one that came meanwhile interrupts at arm().
        proc = subprocess.Popen(torchrun_command(plan, plan_path), env=rank_environment(plan),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", start_new_session=True,
                                preexec_fn=stop_with_parent(os.getpid()))
        guard.group = proc.pid
        guard.arm()
        for raw in proc.stdout:
            stream.line(raw.rstrip("\n"))
        code = proc.wait()
        if code < 0:  # torchrun itself killed: the shell's 128 + signal, as we exit with it
            code = 128 - code
    except KeyboardInterrupt as err:
        guard.hold()
        interrupted = err.args[0] if err.args and isinstance(err.args[0], int) else signal.SIGINT
        if proc is not None:
            _kill_group(proc)
        code = 128 + interrupted
    finally:
        guard.hold()
        progress.close()
        if proc is not None:
            if proc.poll() is None:
                _kill_group(proc)
            _reap_group(proc)
        # The ranks are gone: what a full disk took from them, the final records get back.
        _release(reserve)
    if code == 0:
        reason = "completed"
    elif interrupted is not None:
        reason = describe_interruption(interrupted)
    else:
        reason = describe_failure(code, stream.lines, stream.errors, plan.gpus)
    record = {"exit_code": code, "reason": reason, "executor": "local",
              "elapsed_s": round(time.time() - started, 3), "ended": time.time()}
    try:
        (exp_dir / EXIT_FILE).write_text(json.dumps(record, indent=2))
    except OSError as err:
        print(f"trainbench: warning: could not write {EXIT_FILE}: {err.strerror}",
              file=sys.stderr)
    if code != 0:
        stream.to_log(f"trainbench: job failed: {reason}")
    stream.flush()
    return code


# --- what the ranks and torchrun print ----------------------------------------------------------

# glog-style lines (torchrun's agent, c10d's C++ warnings): "W1123 06:31:20.270000 5230 ...".
_GLOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")
_RANK_ERROR = re.compile(r"^\[rank (\d+)\] trainbench engine error: (.*)$")
_RANK_ERROR_INSIDE = re.compile(r"(?<=.)\[rank \d+\] trainbench engine error: ")
# torch prefixes a rank's uncaught traceback with "[rank0]:".
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:")


class RankOutput:
    """Routes torchrun's merged output: step lines and the run's own messages to the
    terminal; torchrun's agent logs, tracebacks and everything after a rank failed to the
    log file only (the terminal gets the one-line cause at the end)."""

    def __init__(self, progress: Progress, log_path: Path, announcement: str = ""):
        self.progress = progress
        self.log_path = log_path
        # The engine's first line names the plan for the log; `run` has said it already.
        self.announcement = announcement
        self.failing = False
        self.lines: list[str] = []  # torchrun's own lines, for its failure summary
        self.errors: dict[int, str] = {}  # rank -> its one-line error, the first it printed
        self._pending: list[str] = []

    def line(self, text: str) -> None:
        # Two ranks' lines glued together (an older engine, another tool's unbuffered
        # print): the error line that starts inside is read as the line it was.
        if m := _RANK_ERROR_INSIDE.search(text):
            self.line(text[:m.start()])
            self.line(text[m.start():])
            return
        if step_fields(text):
            self.progress.line(text)
            return
        if self.announcement and text.startswith(self.announcement):
            return
        if m := _RANK_ERROR.match(text):
            # report_failure already wrote this rank's error and traceback to the log.
            self.errors.setdefault(int(m.group(1)), m.group(2))
            self.failing = True
            return
        if any(noise in text for noise in _NOISE):
            return
        agent = _GLOG.match(text)
        if (agent and text.startswith("E")) or _RANK_PREFIX.match(text) \
                or text.startswith("Traceback (most recent call last)"):
            self.failing = True
        if agent or self.failing:
            self.lines = (self.lines + [text])[-400:]
            self.to_log(text)
            return
        self.progress.line(text)

    def to_log(self, text: str) -> None:
        self._pending.append(text)
        self.flush()

    def flush(self) -> None:
        """Append what is pending to the log; on a full disk it waits for the end of the
        run, when the launcher's reserve is free."""
        if not self._pending:
            return
        try:
            with open(self.log_path, "a") as log:
                log.write("".join(f"{t}\n" for t in self._pending))
            self._pending.clear()
        except OSError:
            self._pending = self._pending[-1000:]


# --- why a run failed ------------------------------------------------------------------------

# A rank whose peer died fails too, with one of these; it is a consequence, not the cause.
_PEER_ERROR = re.compile(
    r"Connection reset by peer|Connection closed by peer|Connection refused|Broken pipe|"
    r"NCCL communicator was aborted|remote worker|Socket Timeout|timed out|"
    r"DistNetworkError|DistBackendError|ProcessGroupNCCL|ProcessGroupGloo|Gloo connectFullMesh",
    re.IGNORECASE)
_DISK_FULL = re.compile(r"No space left on device|Errno 28\b|ENOSPC|Disk quota exceeded|"
                        r"Errno 122\b|database or disk is full|^disk full", re.IGNORECASE)


_EXITCODE = re.compile(r"\s*exitcode\s*:\s*(-?\d+)(?:\s*\(pid:\s*(\d+)\))?")


def torchrun_failures(lines: list[str]) -> tuple[dict[int, tuple[int, int | None]], set[int]]:
    """From torchrun's output: {rank: (exit code, pid)} of the failed ranks, and the pids
    torchrun itself stopped with a closing signal after the first failure."""
    failures: dict[int, tuple[int, int | None]] = {}
    closed: set[int] = set()
    rank = None
    for line in lines:
        if m := re.search(r"Sending process (\d+) closing signal", line):
            closed.add(int(m.group(1)))
        elif m := re.search(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)",
                            line):
            failures.setdefault(int(m.group(2)), (int(m.group(1)), int(m.group(3))))
        elif m := re.match(r"\s*rank\s*:\s*(\d+)", line):
            rank = int(m.group(1))
        elif rank is not None and (m := _EXITCODE.match(line)):
            failures.setdefault(rank, (int(m.group(1)), int(m.group(2)) if m.group(2) else None))
            rank = None
    return failures, closed


def first_cause(failures: dict[int, tuple[int, int | None]], closed: set[int],
                errors: dict[int, str]) -> int | None:
    """The rank whose failure came first by cause: killed by a signal nobody in the job
    sent, then an error of its own, then a peer's connection error, then a rank torchrun
    stopped itself; among equals a full disk, then the lowest rank."""
    def tier(rank: int) -> int:
        exitcode, pid = failures.get(rank, (1, None))
        if pid is not None and pid in closed:
            return 3
        if exitcode < 0:
            return 0
        return 2 if _PEER_ERROR.search(errors.get(rank, "")) else 1
    ranks = set(failures) | set(errors)
    # Among equals, a rank that saw the disk full names the cause its peers saw as an error.
    return min(ranks, key=lambda r: (tier(r), not _DISK_FULL.search(errors.get(r, "")), r)
               ) if ranks else None


def describe_failure(code: int, lines: list[str], errors: dict[int, str] | None = None,
                     world: int = 2) -> str:
    """One line naming the rank whose failure came first by cause, and why."""
    errors = errors or {}
    failures, closed = torchrun_failures(lines)
    rank = first_cause(failures, closed, errors)
    if rank is None:
        if code > 128 and code - 128 in signal.valid_signals():
            name = signal.Signals(code - 128).name
            return f"torchrun was killed by {name}; its ranks died with it"
        return f"torchrun exited with code {code}"
    exitcode = failures.get(rank, (None, None))[0]
    if exitcode is not None and exitcode < 0 and -exitcode in signal.valid_signals():
        what = f"killed by {signal.Signals(-exitcode).name}"
    else:
        what = f"exit code {exitcode if exitcode is not None else code}"
    error = errors.get(rank, "")
    disk_full = bool(_DISK_FULL.search(error))
    error = error.removeprefix("disk full: ")
    text = f"rank {rank} failed ({what})"
    if error:
        text += f": {_shorten(error)}"
    if world > 1:
        text += "; the other ranks were stopped"
    return f"disk full: {text}" if disk_full else text


def _shorten(message: str, limit: int = 240) -> str:
    # gloo appends a paragraph of advice to every error; the first sentence says it.
    message = message.split(" This is typically caused by")[0].strip()
    return message if len(message) <= limit else message[:limit - 3] + "..."


def describe_interruption(signum: int) -> str:
    name = signal.Signals(signum).name
    how = {"SIGINT": "Ctrl-C", "SIGHUP": "a closed terminal",
           "SIGTERM": "a kill of the launcher"}.get(name, name)
    return f"interrupted by {name} ({how}); the ranks were stopped"


# --- the launcher's own safety ---------------------------------------------------------------

# Room kept on the run's disk for the launcher's final records (exit.json, the log's last
# line, the job history), released once the ranks are gone.
RESERVE_BYTES = 1 << 20
# A new run needs at least this much free space where its directory would be created.
MIN_FREE_BYTES = 32 << 20


def disk_space_problem(root: str | Path) -> str | None:
    """Why a run cannot start under root for lack of space, or None."""
    try:
        where = Path(root).resolve()
    except (RuntimeError, OSError):  # a symlink loop: root_problem names it
        return None
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return None
    if free >= MIN_FREE_BYTES:
        return None
    return (f"disk full: {free / 2**20:.1f} MiB free under {where}, and a run needs at least "
            f"{MIN_FREE_BYTES >> 20} MiB; free some space or pass --root on another disk")


def _reserve_space(exp_dir: Path) -> Path | None:
    path = exp_dir / ".launcher-reserve"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        finally:
            os.close(fd)
        return path
    except OSError:
        _release(path)
        return None


def _release(path: Path | None) -> None:
    if path is not None:
        try:
            path.unlink()
        except OSError:
            pass


def stop_with_parent(parent: int):
    """preexec_fn for a child that must not outlive `parent` (torchrun under the launcher,
    a command under `accept`): it gets SIGTERM, and stops what it started in order, when
    the parent dies, even by SIGKILL, which no handler of ours can catch."""
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork
    pr_set_pdeathsig, sigterm = 1, int(signal.SIGTERM)

    def child() -> None:
        libc.prctl(pr_set_pdeathsig, sigterm)
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(1)
    return child


def _reap_group(proc: subprocess.Popen) -> None:
    """Kill anything torchrun left behind in its session: no orphan ranks, ever."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue
