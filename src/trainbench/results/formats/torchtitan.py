"""torchtitan's step lines (MetricsProcessor.log) and train()'s start line."""

from __future__ import annotations

import bisect
import math
import re
from datetime import datetime

from ..parse import _NUM, LogFormat, StepRecord, number, register


# --- torchtitan -----------------------------------------------------------------------------

# torchtitan/components/metrics.py, MetricsProcessor.log:
#   f"step: {step:2}  loss: {loss:7.4f}  grad_norm: {grad_norm:7.4f}  "
#   f"memory: {max_reserved_gib:5.2f}GiB({max_reserved_pct:.2f}%)  tps: {round(tps):,}  "
#   f"tflops: {tflops:,.2f}  mfu: {mfu:.2f}%"
# (older releases print no grad_norm); its validator prints `validate step: ...`, which
# is no training step.
_TITAN_STEP = re.compile(r"(?<!validate )\bstep:\s*(\d+)\s+loss:\s*(" + _NUM + r")")
_TITAN_TIME = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")
_TITAN_FIELDS = re.compile(
    r"grad_norm:\s*(?P<grad>" + _NUM + r")|memory:\s*(?P<mem>[\d.]+)GiB"
    r"|tflops:\s*(?P<tflops>\d[\d,]*(?:\.\d+)?)")
# torchtitan/train.py, Trainer.train: `Training starts at step {self.step + 1}` (with the
# batch sizes and run length in older releases), printed just before the first step.
_TITAN_START_STEP = re.compile(r"Training starts at step (\d+)")
_TITAN_START = re.compile(
    r"Training starts at step \d+, with local batch size (\d+), global batch size (\d+), "
    r"sequence length (\d+), total steps (\d+)")
_TITAN_MESH = re.compile(r"device mesh with \[[^\]]*\], \[([\d, ]+)\]")


def _titan_stamp(text: str) -> datetime | None:
    stamp = _TITAN_TIME.search(text)
    if stamp is None:
        return None
    try:
        when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")
    except ValueError:  # 2026-13-45: not a time
        return None
    return when.replace(microsecond=int(stamp.group(2)) * 1000)


@register
class TorchTitan(LogFormat):
    """`[rank0]:[titan] 2025-06-16 22:30:50,322 - root - INFO - step: 200  loss:  6.1384
    memory: 49.66GiB(52.28%)  tps: 5,856  tflops: 339.16  mfu: 34.29%`, every rank
    printing, at step 1 and every `log_freq` steps. No step time is printed: it is the
    time between two logged steps (the interval torchtitan's own tps and mfu are measured
    over) divided by the steps between them. The first logged step is timed from the
    `Training starts at step N` line printed just before it (so a log of steps 1-10 has
    ten timed steps); in an excerpt without that line it has no time, and a note says so."""

    name = "torchtitan"
    title = "torchtitan"
    markers = (b"GiB(",)
    head_markers = (b"Training starts at step", b"device mesh with")
    banners = (b"[titan]",)

    def __init__(self):
        self.stamps: dict[int, datetime] = {}
        self.order: list[int] = []  # the stamped iterations, sorted
        self.start: tuple[int, datetime] | None = None
        """(0-based iteration of the first step, when `Training starts` was printed)."""
        self.untimed: int | None = None

    def read_head(self, text, state):
        if match := _TITAN_START.search(text):
            state.fact("gbs", int(match.group(2)))
            state.fact("seq_len", int(match.group(3)))
            state.fact("total_iterations", int(match.group(4)))
        elif match := _TITAN_MESH.search(text):
            state.fact("world_size", math.prod(int(d) for d in match.group(1).split(",")))
        elif "Profiling active" in text:
            state.profiled(text)
        if self.start is None and (match := _TITAN_START_STEP.search(text)):
            when = _titan_stamp(text)
            if when is not None:
                self.start = (int(match.group(1)) - 1, when)

    def read(self, text, state):
        step = _TITAN_STEP.search(text)
        if step is None:
            return
        # torchtitan counts steps from 1.
        rec = StepRecord(int(step.group(1)) - 1, loss=number(step.group(2)))
        for match in _TITAN_FIELDS.finditer(text):
            if match.group("grad"):
                rec.grad_norm = number(match.group("grad"))
            elif match.group("mem"):
                rec.peak_memory_bytes = int(float(match.group("mem")) * 2**30)
            elif match.group("tflops"):
                rec.tflops_per_gpu = float(match.group("tflops").replace(",", ""))
        when = _titan_stamp(text)
        if when is not None and rec.iteration not in self.stamps:
            self._time(rec, when)
        # Every rank prints the step; any of them names the format.
        state.step(self.name, rec)
        if state.detected is None:
            state.detected = self.name

    def _time(self, rec: StepRecord, when: datetime) -> None:
        """The step time of a newly stamped step: from the nearest earlier stamped step,
        or for the first one from the training-start line."""
        at = bisect.bisect_left(self.order, rec.iteration)
        self.order.insert(at, rec.iteration)
        self.stamps[rec.iteration] = when
        if at > 0:
            prev = self.order[at - 1]
            since, steps = self.stamps[prev], rec.iteration - prev
        elif self.start is not None and self.start[0] <= rec.iteration:
            since, steps = self.start[1], rec.iteration - self.start[0] + 1
        else:
            self.untimed = rec.iteration
            return
        rec.step_time_s = (when - since).total_seconds() / steps

    def finish(self, state):
        total = state.scan.facts.get("total_iterations")
        records = state.records.get(self.name, {})
        for rec in records.values():
            rec.total_iterations = total if isinstance(total, int) else None
        if self.untimed is not None and self.untimed in records and self.order \
                and self.order[0] == self.untimed:
            state.scan.notes.append(
                f"torchtitan: the first logged step ({self.untimed + 1}) has no step time: "
                "the log holds no `Training starts at step` line before it to time it from")
