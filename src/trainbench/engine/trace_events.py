"""Reading a torch.profiler Chrome trace: step windows, event kinds, interval sums.

The trace is the one artefact every backend produces (`export_chrome_trace`), so the
profile summary and the communication summary are both computed from its events
(`traceEvents`, complete events `ph: X` with `ts`/`dur` in microseconds). No torch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

STEP_MARK = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass(slots=True)
class Event:
    name: str
    cat: str
    tid: object
    start: float
    """Microseconds, the trace's clock."""
    dur: float
    args: dict

    @property
    def end(self) -> float:
        return self.start + self.dur

    def contains(self, other: "Event") -> bool:
        return (self.tid == other.tid and self.start <= other.start
                and other.end <= self.end + 1e-3)


def load_events(path: str | Path) -> list[Event]:
    """The complete (`X`) events of a trace file, sorted by start time."""
    data = json.loads(Path(path).read_text())
    raw = data["traceEvents"] if isinstance(data, dict) else data
    events = [Event(name=str(e.get("name", "")), cat=str(e.get("cat", "")), tid=e.get("tid"),
                    start=float(e["ts"]), dur=float(e.get("dur", 0.0)), args=e.get("args") or {})
              for e in raw if e.get("ph") == "X" and "ts" in e]
    events.sort(key=lambda e: (e.start, -e.dur))
    return events


def step_windows(events: list[Event]) -> dict[int, Event]:
    """Iteration number -> its `ProfilerStep#N` event."""
    out = {}
    for event in events:
        match = STEP_MARK.match(event.name)
        if match:
            out[int(match.group(1))] = event
    return out


def step_of(time_us: float, windows: dict[int, Event]) -> int | None:
    for step, window in windows.items():
        if window.start <= time_us <= window.end:
            return step
    return None


# --- kinds of events ---------------------------------------------------------------------

def is_gpu_event(event: Event) -> bool:
    return event.cat in ("kernel", "gpu_memcpy", "gpu_memset")


def is_comm_kernel(event: Event) -> bool:
    return event.cat == "kernel" and "nccl" in event.name.lower()


def is_comm_execution(event: Event) -> bool:
    """Where a collective's data moves: gloo's worker-thread spans, NCCL's kernels."""
    return event.name.startswith("gloo:") or is_comm_kernel(event)


def is_comm_op(event: Event) -> bool:
    """A CPU-side op that issues, waits for or wraps a collective."""
    name = event.name
    return (name.startswith(("c10d::", "_c10d_functional", "c10d_functional::", "nccl:",
                             "gloo:", "record_param_comms"))
            or name == "record_param_comms")


# --- interval arithmetic ------------------------------------------------------------------

Interval = tuple[float, float]


def union(intervals: list[Interval]) -> list[Interval]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def total(intervals: list[Interval]) -> float:
    return sum(b - a for a, b in union(intervals))


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    a, b = union(a), union(b)
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out
