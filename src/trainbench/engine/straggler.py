"""Stragglers: each rank's compute time per step, and the rank that holds the others up.

Why not the step time: ranks meet in collectives inside the step (FSDP2's all-gathers
and reduce-scatters in forward and backward, TP's all-reduces, the gradient-norm
all-reduce), so a fast rank blocks there until the slowest one arrives and every rank's
forward+backward wall time comes out the same. A rank's compute time is its step time
minus the time it spent blocked in collectives.

How the blocked time is measured (a few instrumented steps only, `instrumented_steps`):
a dispatch mode (`WaitTimer`) sees every collective the training thread issues (c10d
ops from FSDP2 and torch.distributed, `_c10d_functional` ops from DTensor) and times the
collective from its issue to its completion, waiting for it on the spot:
- gloo (CPU): the op's Work is waited for inside the timed call; the later `wait()` of
  FSDP2 or torch.distributed then returns at once.
- NCCL (CUDA): a Work's wait only makes a stream wait, so the device is synchronised
  before the collective (queued compute is finished: compute, not waiting) and after
  its wait (the collective is done): the host time between is the rank's time in it.
On a slow rank the collectives' times are their transfer times; on a fast rank they add
the time it waited for the slow one. So compute = step time - time in collectives.
The clock: on a GPU, host wall time (the device synchronised around each collective, so
it is the device's time). On a CPU, the process's CPU time (time.process_time, intra-op
threads included), the step's less that spent inside collectives: ranks sharing cores
with each other and with other jobs lose wall time whenever they are descheduled, which
on a 2-core machine moved a rank's wall-clock compute by 25% between identical runs; CPU
time is not charged while a rank waits for a core. Measured on the 2-core test machine
(tiny Llama, DP2, 2 instrumented steps): two identical ranks 0.9% apart; rank 1 given
0.1 s more per microbatch (GA 2) 0.20 s/step more, as injected.
The price: on an instrumented step, collectives do not overlap compute and the mode's
Python runs for every op: on the 2-core CPU a tiny DP2 step took 0.47 s instead of 0.28 s
(TP2: 2.0 s instead of 1.25 s). So no step of the results' window is instrumented: the
steps after it (a 50-step run: 45-47), else the warm steps before it (never a run's first
step). A run with neither (fewer than 7 steps) is not measured, and its log says so.

What was not used, and why: torch.distributed's per-collective timing
(`Work._get_duration`, TORCH_NCCL_ENABLE_TIMING) and the NCCL flight recorder exist
only for NCCL, so nothing here could test them, and they time the collective itself,
which includes the wait this measure must separate out; an explicit barrier after
backward would see nothing of the waits inside forward and backward under FSDP2.

The per-rank times go to rank 0 in one all_gather_object after the last instrumented
step (outside any timed region); rank 0 writes run.json's `straggler` and logs a line.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from .comm_trace import op_kind
from .straggler_text import SLOW_RANK_ENV, parse_slow_rank

THRESHOLD_PCT = 5.0
INSTRUMENTED_STEPS = 3
METHOD = ("compute = time in the step outside collectives, per rank: on a GPU the step's "
          "wall time (device synchronised) less the wall time in collectives; on a CPU the "
          "process's CPU time in the step less its CPU time in collectives")
_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")


def instrumented_steps(first: int, total: int, window: tuple[int, int]) -> list[int]:
    """The iterations timed for stragglers (the run covers first..total-1; the window is
    in the same numbering): up to INSTRUMENTED_STEPS outside the window, those after it
    first, then the latest before it but the run's first (its one-off costs differ per
    rank). [] when there are none."""
    after = list(range(window[1] + 1, total))[:INSTRUMENTED_STEPS]
    before = list(range(first + 1, window[0]))[-(INSTRUMENTED_STEPS - len(after)):]
    return sorted(before + after) if len(after) < INSTRUMENTED_STEPS else after


def not_measured(total_steps: int) -> str:
    return (f"stragglers not measured: a run of {total_steps} steps has no step outside the "
            "results' window to time (run 7 steps or more)")


def install_slow_hook(model_parts, rank: int) -> float:
    """Test hook: TRAINBENCH_SLOW_RANK=R:S makes rank R spend S seconds more in each
    microbatch's forward (each pipeline stage's, with PP), as a slow GPU would.
    Returns the delay installed on this rank (0.0 on the others)."""
    parsed = parse_slow_rank(os.environ.get(SLOW_RANK_ENV))
    if parsed is None or parsed[0] != rank or parsed[1] == 0:
        return 0.0
    delay = parsed[1]

    cpu = next(iter(model_parts[0].parameters())).device.type == "cpu"

    def slow(module, args):
        if cpu:  # real work: a CPU rank's compute is measured in CPU time
            end = time.thread_time() + delay
            while time.thread_time() < end:
                pass
        else:  # the host late to launch: the GPU runs dry for about that long
            time.sleep(delay)

    for part in model_parts:
        part.register_forward_pre_hook(slow)
    return delay


def make_wait_timer(device):
    """A TorchDispatchMode adding the host time of every collective (issue to completion,
    the wait included) to its `blocked_s`."""
    cuda = device.type == "cuda"
    work_type = torch._C._distributed_c10d.Work

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def wait_works(out) -> None:
        for value in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(value, torch.ScriptObject) and "Work" in str(value._type()):
                work_type.unbox(value).wait()
            elif isinstance(value, work_type):
                value.wait()

    class WaitTimer(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.blocked_s = 0.0
            self.blocked_cpu_s = 0.0
            self.collectives = 0
            self.cpu_s = 0.0

        def __enter__(self):
            self.cpu_s = -time.process_time()
            return super().__enter__()

        def __exit__(self, *exc):
            self.cpu_s += time.process_time()
            return super().__exit__(*exc)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if isinstance(func, torch._ops.HigherOrderOperator):
                return func(*args, **kwargs)
            # DTensor desugars its op into plain-tensor ops, collectives included, which
            # come back through this mode.
            if any(issubclass(t, DTensor) for t in types):
                return NotImplemented
            name = f"{func.namespace}::{func._opname}"
            waiting = func._opname.startswith("wait_tensor")
            if func.namespace not in _COLLECTIVE_NAMESPACES or \
                    (op_kind(name) is None and not waiting):
                return func(*args, **kwargs)
            sync()
            start, cpu_start = time.perf_counter(), time.process_time()
            out = func(*args, **kwargs)
            if func.namespace == "c10d":
                wait_works(out)
            elif not waiting:  # functional: the result's wait_tensor completes it
                for value in out if isinstance(out, (tuple, list)) else (out,):
                    if isinstance(value, torch.Tensor):
                        torch.ops._c10d_functional.wait_tensor(value)
            sync()
            self.blocked_s += time.perf_counter() - start
            self.blocked_cpu_s += time.process_time() - cpu_start
            self.collectives += 1
            return out

    return WaitTimer()


class StragglerMonitor:
    """Per-rank compute times on the instrumented steps; rank 0 gets everyone's."""

    def __init__(self, device, rank: int, local_rank: int, steps: list[int],
                 window: tuple[int, int], stage: int = 0):
        self.device, self.rank, self.local_rank = device, rank, local_rank
        self.steps, self.window, self.stage = list(steps), window, stage
        self.records: list[dict] = []  # this rank's: step, step_s, blocked_s, compute_s
        self.timer = None

    def context(self, step: int):
        """The dispatch mode around a step's timed part when the step is instrumented."""
        if step not in self.steps:
            self.timer = None
            return contextlib.nullcontext()
        self.timer = make_wait_timer(self.device)
        return self.timer

    def after_step(self, step: int, elapsed: float) -> list[dict] | None:
        """Record an instrumented step; after the last one, every rank's records (on
        rank 0; [] elsewhere). None on other steps."""
        if self.timer is not None and step in self.steps:
            t = self.timer
            record = {"step": step, "step_s": elapsed, "blocked_s": t.blocked_s,
                      "cpu_s": t.cpu_s, "blocked_cpu_s": t.blocked_cpu_s,
                      "collectives": t.collectives}
            if self.device.type == "cpu":
                record["compute_s"] = max(0.0, t.cpu_s - t.blocked_cpu_s)
            else:
                record["compute_s"] = max(0.0, elapsed - t.blocked_s)
            self.records.append(record)
            self.timer = None
        if not self.steps or step != self.steps[-1]:
            return None
        mine = {"rank": self.rank, "host": socket.gethostname(), "local_rank": self.local_rank,
                "stage": self.stage, "steps": self.records}
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        return gathered if self.rank == 0 else []


def summarize(ranks: list[dict], probe_command: str) -> dict:
    """The straggler verdict from every rank's records.

    Ranks are compared with the ranks doing the same work: those of one pipeline stage
    (`stage`; all ranks without PP), since stages hold different layers. A rank is the
    straggler when its median compute time is more than THRESHOLD_PCT above the median
    of its group's per-rank medians.
    """
    per_rank = []
    for entry in sorted(ranks, key=lambda e: e["rank"]):
        computes = [s["compute_s"] for s in entry.get("steps", [])]
        per_rank.append({"rank": entry["rank"], "host": entry.get("host"),
                         "local_rank": entry.get("local_rank"), "stage": entry.get("stage", 0),
                         "compute_s": computes,
                         "blocked_s": [s["blocked_s"] for s in entry.get("steps", [])],
                         "median_compute_s": statistics.median(computes) if computes else None})
    steps = sorted({s["step"] for e in ranks for s in e.get("steps", [])})
    out = {"method": METHOD,
           "steps": steps, "threshold_pct": THRESHOLD_PCT, "ranks": per_rank,
           "groups": [], "slowest": None, "flagged": False}
    worst = None
    for stage in sorted({r["stage"] for r in per_rank}):
        members = [r for r in per_rank if r["stage"] == stage and r["median_compute_s"]]
        if len(members) < 2:
            continue
        median = statistics.median(r["median_compute_s"] for r in members)
        slow = max(members, key=lambda r: r["median_compute_s"])
        fast = min(members, key=lambda r: r["median_compute_s"])
        pct = 100 * (slow["median_compute_s"] / median - 1)
        group = {"stage": stage, "ranks": [r["rank"] for r in members],
                 "median_compute_s": median, "slowest_rank": slow["rank"],
                 "slowest_pct_above_median": pct,
                 "spread_pct": 100 * (slow["median_compute_s"] / fast["median_compute_s"] - 1)}
        out["groups"].append(group)
        if worst is None or pct > worst[0]:
            worst = (pct, slow, median)
    if worst is not None:
        pct, slow, median = worst
        out["slowest"] = {"rank": slow["rank"], "host": slow["host"],
                          "local_rank": slow["local_rank"],
                          "median_compute_s": slow["median_compute_s"],
                          "group_median_compute_s": median, "pct_above_median": pct}
        out["flagged"] = pct > THRESHOLD_PCT
        if out["flagged"]:
            out["probe_command"] = probe_command
    return out


def probe_command(gpus: int, gpu_type: str, nodes: int, gpus_per_node: int) -> str:
    """The probe that would time this run's GPUs and links the same way."""
    cmd = f"trainbench probe --scale {gpus} --gpu {gpu_type}"
    if nodes > 1:
        cmd += f" --nodes {nodes} --gpus-per-node {gpus_per_node}"
    return cmd
