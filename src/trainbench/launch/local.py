"""The local executor: torchrun on this machine, one process per rank.

torchrun's agent watches the ranks: when one dies it stops the others, so a crash ends
the whole job. The launcher runs torchrun in its own session and kills that whole group
on interruption, so no rank outlives the command.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..plan import Plan
from .experiment import EXIT_FILE, PLAN_FILE, log_file_name

STEP_LINE = re.compile(r"iteration (\d+)/(\d+) .*reduced_train_loss: (\S+) .*"
                       r"train_step_timing in s: (\S+)")
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
        "--max-restarts=0", "--monitor-interval=1",
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
        env.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "COLL,P2P,NET"})
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Progress:
    """A rich progress bar on a terminal; plain lines otherwise (CI, pipes, files)."""

    def __init__(self, total: int, interactive: bool):
        self.interactive = interactive
        self.bar = None
        self.first: int | None = None  # first iteration seen
        if interactive:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress
            from rich.progress import TextColumn, TimeRemainingColumn
            self.bar = RichProgress(TextColumn("training"), BarColumn(), MofNCompleteColumn(),
                                    TextColumn("{task.fields[info]}"), TimeRemainingColumn())
            self.task = self.bar.add_task("train", total=total, info="")
            self.bar.start()

    def line(self, text: str) -> None:
        match = STEP_LINE.search(text)
        if self.bar is None:
            print(text, flush=True)
            return
        if match:
            it, _, loss, step_time = match.groups()
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


def run_local(plan: Plan, exp_dir: Path, interactive: bool | None = None) -> int:
    """Run the plan with torchrun; returns its exit code and writes exit.json."""
    plan_path = exp_dir / PLAN_FILE
    if plan.features.profile == "nsys":
        (exp_dir / "profile").mkdir(exist_ok=True)
    if interactive is None:
        interactive = sys.stdout.isatty()
    started = time.time()
    proc = subprocess.Popen(torchrun_command(plan, plan_path), env=rank_environment(plan),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    progress = Progress(plan.steps, interactive)
    tail: list[str] = []
    # torchrun runs in its own session (so a Ctrl-C reaches only this launcher, which then
    # stops the ranks in order); a closed terminal or a kill must stop them the same way.
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        for raw in proc.stdout:
            text = raw.rstrip("\n")
            tail = (tail + [text])[-200:]
            progress.line(text)
        code = proc.wait()
    except KeyboardInterrupt:
        _kill_group(proc)
        code = 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        progress.close()
        if proc.poll() is None:
            _kill_group(proc)
        _reap_group(proc)
    reason = "completed" if code == 0 else describe_failure(code, tail)
    record = {"exit_code": code, "reason": reason, "executor": "local",
              "elapsed_s": round(time.time() - started, 3), "ended": time.time()}
    (exp_dir / EXIT_FILE).write_text(json.dumps(record, indent=2))
    if code != 0:
        with open(exp_dir / log_file_name(plan.name), "a") as log:
            log.write(f"trainbench: job failed: {reason}\n")
    return code


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def describe_failure(code: int, tail: list[str]) -> str:
    """One line naming the failed rank and why, from torchrun's error summary."""
    if code == 130:
        return "interrupted (Ctrl-C, a closed terminal or a kill of the launcher)"
    rank = exitcode = None
    for line in tail:
        if m := re.search(r"rank\s*:\s*(\d+)", line):
            rank = rank or m.group(1)
        if m := re.search(r"exitcode\s*:\s*(-?\d+)", line):
            exitcode = exitcode or int(m.group(1))
    if rank is None:
        return f"torchrun exited with code {code}"
    what = (f"killed by {signal.Signals(-exitcode).name}" if exitcode and exitcode < 0
            and -exitcode in signal.valid_signals() else f"exit code {exitcode}")
    return f"rank {rank} failed ({what}); the other ranks were stopped"


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
