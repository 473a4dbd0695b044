"""The run's records a rank keeps beside training, as collaborators the trainer calls:
this node's conditions, the timed window's telemetry (metrics.jsonl lines and run.json's
summary), the straggler verdict, and a failing rank's report. Every run.json update is
one atomic write (trainbench.rundir)."""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import traceback
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from .. import conditions
from ..conditions import SHARED_GPU_LINE
from ..plan import Plan
from ..rundir import RUN_FILE, log_file_name, update_run_record
from .log import StepMetrics
from .parallel.mesh import ParallelDims
from .straggler import StragglerMonitor, instrumented_steps, not_measured, probe_command, summarize
from .straggler_text import describe
from .telemetry import Sampler, combine


def record_conditions(exp_dir: Path) -> dict:
    """This node's conditions (local rank 0), also written to conditions-<host>.json.
    A record that cannot be made never stops the run: the reason is in `missing`."""
    try:
        info = conditions.collect(rank_threads=torch.get_num_threads())
    except Exception as exc:  # noqa: BLE001
        info = {"schema": conditions.SCHEMA,
                "missing": [f"conditions: {type(exc).__name__}: {exc}"]}
    exp_dir.mkdir(parents=True, exist_ok=True)
    path = exp_dir / f"conditions-{socket.gethostname()}.json"
    path.write_text(json.dumps(info, indent=2))
    return info


class WindowTelemetry:
    """Node telemetry over the timed window (the seeds' iterations 11-44 of 50, scaled):
    local rank 0 samples clocks, power and energy; each metrics.jsonl line inside the
    window carries the step's summary, and at its end rank 0 writes the job's to run.json."""

    def __init__(self, plan: Plan, window: tuple[int, int], device: torch.device, rank: int,
                 local_rank: int, world_size: int, exp_dir: Path, log: Callable[[str], None]):
        self.plan, self.window, self.device = plan, window, device
        self.rank, self.local_rank, self.world_size = rank, local_rank, world_size
        self.exp_dir, self.log = exp_dir, log
        self.sampler = None

    def before_step(self, step: int) -> None:
        if step == self.window[0] and self.local_rank == 0:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
            self.sampler = Sampler(self.device.type, local_gpus=local)
            self.sampler.start()

    def record(self, metrics: StepMetrics) -> str:
        """The step's metrics.jsonl line; inside the window it carries rank 0's node
        telemetry for the step (`telemetry`: energy, mean clock and power, peak
        temperature, slowdown reasons)."""
        line = metrics.to_json()
        step = self.sampler.step_summary() if self.sampler is not None else None
        if step is None:
            return line
        data = json.loads(line)
        data["telemetry"] = step
        return json.dumps(data)

    def after_step(self, step: int) -> None:
        """At the window's end every rank joins one all-reduce of the nodes' energy and
        throttling; rank 0 writes the job's summary into run.json."""
        if step != self.window[1]:
            return
        node = self.stop()
        energy = node.get("energy_j") if node else None
        # [nodes, nodes with energy, energy (J), nodes throttled, nodes with a shared GPU]
        facts = torch.tensor([1.0 if node else 0.0, 1.0 if energy is not None else 0.0,
                              energy or 0.0, 1.0 if node and node.get("throttled") else 0.0,
                              1.0 if node and node.get("shared_gpus") else 0.0],
                             dtype=torch.float64, device=self.device)
        dist.all_reduce(facts, op=dist.ReduceOp.SUM)
        if self.rank != 0:
            return
        first, last = self.window
        tokens = self.plan.seq_len * self.plan.gbs * (last - first + 1)
        nodes, with_energy, total, throttled, shared = facts.tolist()
        node = node or {"source": None, "samples": 0, "throttled": None, "throttle_reasons": [],
                        "missing": ["telemetry: rank 0 sampled nothing"]}
        summary = combine(node, total if with_energy else None, int(nodes), int(with_energy),
                          int(throttled), tokens, nodes_shared=int(shared))
        summary["window"] = [first, last]
        try:  # a full disk leaves run.json as it was, and the run goes on
            update_run_record(self.exp_dir, {"telemetry": summary})
        except OSError as exc:
            self.log(f"trainbench: telemetry not written to {RUN_FILE}: {exc}")
        if summary.get("throttled"):
            self.log("trainbench: clocks throttled during the timed window: "
                     + ", ".join(summary["throttle_reasons"]))
        if summary.get("gpu_shared"):
            self.log(f"trainbench: {SHARED_GPU_LINE}")

    def stop(self) -> dict | None:
        """The sampler's node summary, stopping it (None where none ran)."""
        node = self.sampler.stop() if self.sampler is not None else None
        self.sampler = None
        return node


def straggler_monitor(dims: ParallelDims, device: torch.device, rank: int, local_rank: int,
                      first_step: int, total_steps: int, window: tuple[int, int], tracer,
                      log: Callable[[str], None]) -> StragglerMonitor:
    """The monitor of each rank's compute time, instrumenting a few steps outside the
    window (and outside a trace's steps, which keep their collectives' own timing)."""
    world = dims.world_size
    # Not with PP: a stage's send and its peer's are issued in one batch, and waiting for
    # each where it is issued could leave both ranks waiting on their sends.
    measurable = world > 1 and not dims.pp_enabled
    steps = instrumented_steps(first_step, total_steps, window) if measurable else []
    if not steps and measurable:
        log(f"trainbench: {not_measured(total_steps - first_step)}")
    if tracer.enabled:
        traced = range(tracer.window[0] - 1, tracer.window[1] + 1)
        steps = [s for s in steps if s not in traced]
    return StragglerMonitor(device, rank, local_rank, steps, window,
                            stage=dims.coordinate("pp") if dims.pp_enabled else 0)


def report_stragglers(monitor, step: int, elapsed: float, plan: Plan, exp_dir: Path,
                      log: Callable[[str], None]) -> None:
    """After the last instrumented step: rank 0 writes every rank's compute times and
    the verdict to run.json (`straggler`) and logs it (engine/straggler.py)."""
    ranks = monitor.after_step(step, elapsed)
    if not ranks:
        return
    summary = summarize(ranks, probe_command(plan.gpus, plan.gpu_type, plan.num_nodes,
                                             plan.gpus_per_node))
    try:
        update_run_record(exp_dir, {"straggler": summary})
    except OSError as exc:
        log(f"trainbench: straggler record not written to {RUN_FILE}: {exc}")
    line = describe(summary)
    if line:
        log(f"trainbench: {line}")


def report_failure(exp_dir: Path, plan: Plan, exc: BaseException) -> None:
    """This rank's error: the traceback to the run log (O_APPEND keeps ranks' lines whole),
    one line to stderr, which the launcher reads to name the cause of the failure."""
    rank = os.environ.get("RANK", "0")
    line = f"[rank {rank}] trainbench engine error: {failure_line(exc)}"
    text = "".join(traceback.format_exception(exc))
    try:
        fd = os.open(exp_dir / log_file_name(plan.name), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{line}\n{text}".encode())
        os.close(fd)
    except OSError:
        pass  # a full disk: the launcher still gets the line below
    print(line, file=sys.stderr, flush=True)


def failure_line(exc: BaseException) -> str:
    """'Type: message' on one line; a full disk anywhere in the chain (or in one rank's
    part of a checkpoint save) is named first, as the cause of everything after it."""
    seen, todo = set(), [exc]
    while todo:
        err = todo.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"disk full: {type(err).__name__}: {err}"
        todo += [err.__cause__, err.__context__]
        # torch.distributed.checkpoint's CheckpointException: {rank: (exception, trace)}
        failures = getattr(err, "failures", None)
        for wrapped in (failures.values() if isinstance(failures, dict) else ()):
            todo.append(wrapped[0] if isinstance(wrapped, tuple) else wrapped)
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0] if first else ''}".rstrip(": ")
