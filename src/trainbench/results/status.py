"""The status of a run, computed from its step records (never guessed from words alone).

- Success: every iteration of the window was logged and the final iteration was reached.
- Incomplete: steps were logged but the run stopped early, or the window has gaps.
- Failed: no step at all (the last error line of the log says why, when there is one),
  or the run stopped early and its end says it failed (a non-zero exit code, a killed
  launcher): the same verdict `trainbench jobs` gives it.
- Invalid: a NaN or infinite loss or gradient norm; the timings mean nothing.
- Unrecognised: a log in no format trainbench reads, with no known cause of failure in
  it; not counted in the success rate.
- Running: a trainbench run that has not ended (no exit.json, and its launcher still runs
  or the job history says it is queued or running); not counted in the success rate.

A non-finite or non-positive step time makes a run Invalid as a NaN loss does; a run whose
exit.json holds a non-zero exit code is never a Success (summary.summarize_experiment).

A failed run's cause is classified (FAILURE_CLASSES) from the line that states it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from .parse import StepRecord

SUCCESS = "Success"
INCOMPLETE = "Incomplete"
FAILED = "Failed"
INVALID = "Invalid"
UNRECOGNISED = "Unrecognised"
RUNNING = "Running"
STATUSES = (SUCCESS, INCOMPLETE, FAILED, INVALID, UNRECOGNISED, RUNNING)
RATED = (SUCCESS, INCOMPLETE, FAILED, INVALID)
"""The statuses the success rate counts: an unrecognised log says nothing about a run, and
a running one has not ended."""

# Why a run failed, most specific cause first: a Slurm time limit or a node failure
# explains the killed ranks and NCCL timeouts after it; an out-of-memory rank explains
# its peers' NCCL timeouts; a NCCL timeout explains the SIGABRT torchrun reports.
# 'disk full' and 'launcher killed' are what trainbench's own launcher writes in
# exit.json (launch/local.py).
FAILURE_CLASSES: tuple[tuple[str, re.Pattern], ...] = tuple(
    (name, re.compile(pattern, re.IGNORECASE)) for name, pattern in (
        ("Slurm time limit", r"DUE TO TIME LIMIT|time limit exceeded"),
        ("node failure", r"DUE TO NODE FAIL|NODE_FAIL|node failure|Node \S+ not responding"),
        ("disk full", r"^disk full|No space left on device|Errno 28\b|Disk quota exceeded"),
        ("CUDA out of memory", r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|"
                               r"RESOURCE_EXHAUSTED: Out of memory"),
        ("NCCL timeout", r"Watchdog caught collective operation timeout|"
                         r"collective operation timeout|NCCL.*\btimed out|Timeout\(ms\)="),
        ("NCCL error", r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|"
                       r"ncclRemoteError|ncclInvalidUsage|NCCL communicator was aborted"),
        ("NaN/Inf", r"(?:loss|grad(?:ient)?[ _]norm)\s*(?:is|=|:)\s*[-+]?(?:nan|inf)\b|"
                    r"found (?:NaN|Inf)\b|\bNaN detected|returned nan values"),
        ("segmentation fault", r"Segmentation fault|SIGSEGV|signal 11\b|exitcode\s*:\s*-11\b"),
        ("launcher killed", r"^launcher killed"),
        ("rank killed", r"SIGKILL|exitcode\s*:\s*-9\b|\bKilled\b|oom[_-]kill|"
                        r"killed by (?:signal|SIG\w+)"),
        ("Slurm cancelled", r"CANCELLED AT|\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED"),
    ))
FAILURE_CLASS_NAMES = tuple(name for name, _ in FAILURE_CLASSES)


def classify_failure(line: str | None) -> str | None:
    """The failure class a line states, or None."""
    if not line:
        return None
    for name, pattern in FAILURE_CLASSES:
        if pattern.search(line):
            return name
    return None


def failure_rank(name: str) -> int:
    """Position of a class in FAILURE_CLASSES (lower: the more likely root cause)."""
    return FAILURE_CLASS_NAMES.index(name)


@dataclass(frozen=True)
class RunStatus:
    status: str
    detail: str
    """One line saying why (empty for a plain success)."""


def logging_stride(iterations: list[int]) -> int:
    """Steps between logged iterations (1 unless the log prints every k-th step)."""
    gaps = Counter(b - a for a, b in zip(iterations, iterations[1:]) if b > a)
    return gaps.most_common(1)[0][0] if gaps else 1


def window_gaps(iterations: list[int], window: tuple[int, int], stride: int = 1,
                shown: int = 5) -> tuple[int, list[int]]:
    """(how many iterations of the window, at the logging stride, the log does not have;
    the first `shown` of them). Counted, never listed: a window of a billion iterations
    costs time in the iterations logged, not in the window."""
    start, end = window
    have = set(iterations)
    inside = [i for i in iterations if start <= i <= end]
    first = inside[0] if inside else start
    # Align the expected grid to the logged iterations, so a log of every 10th step
    # expects 10, 20, ... rather than the window's own start.
    first -= (first - start) // stride * stride
    grid = range(first, end + 1, stride)
    present = sum(1 for i in have if i in grid)
    missing: list[int] = []
    for i in grid:  # stops after `shown` gaps; at most len(have) present ones are passed
        if len(missing) == shown:
            break
        if i not in have:
            missing.append(i)
    return len(grid) - present, missing


def compute_status(records: list[StepRecord], total_iterations: int | None,
                   window: tuple[int, int], last_error: str | None = None,
                   failed_end: bool = False, recognised: bool = True,
                   formats: str = "") -> RunStatus:
    """Status of a run from its records (sorted by iteration, each with a step time).

    total_iterations is the run length the log or plan states; None when unknown, in
    which case the last logged iteration is taken as the final one and the detail says so.
    failed_end: the run is known to have ended in failure (exit.json's non-zero exit code,
    or a launcher that died without one), so stopping early is a failure, not a pause.
    recognised: False when the log is in no format trainbench reads (formats names them):
    without a known cause of failure in it, it is Unrecognised rather than Failed.
    """
    if not records and not recognised and classify_failure(last_error) is None:
        return RunStatus(UNRECOGNISED, "no line in a format trainbench reads"
                         + (f" ({formats})" if formats else ""))
    if not records:
        why = f": {last_error}" if last_error else " and no error line in the log"
        return RunStatus(FAILED, "no training step was logged" + why)
    for rec in records:
        bad = rec.nonfinite_field()
        if bad:
            name = {"loss": "loss", "grad_norm": "gradient norm",
                    "step_time_s": "step time"}[bad]
            return RunStatus(INVALID, f"{name} is {getattr(rec, bad)} at iteration {rec.iteration}"
                             + (": the timings mean nothing" if bad == "step_time_s" else ""))
    iterations = [r.iteration for r in records]
    last = iterations[-1]
    stride = logging_stride(iterations)
    notes = []
    if total_iterations is None:
        final = last
        notes.append(f"run length not printed: iteration {last} taken as the last")
    else:
        final = total_iterations - 1
    if last < final - (stride - 1):
        detail = f"stopped at iteration {last} of 0..{final}"
        if last_error:
            detail += f": {last_error}"
        return RunStatus(FAILED if failed_end else INCOMPLETE, detail)
    start, end = window
    if end > last:
        return RunStatus(INCOMPLETE, f"window {start}-{end} extends past the last iteration {last}")
    count, missing = window_gaps(iterations, window, stride)
    if count:
        shown = ", ".join(map(str, missing)) + (" ..." if count > len(missing) else "")
        return RunStatus(INCOMPLETE, f"window {start}-{end} misses {count} "
                                     f"iteration(s): {shown}")
    return RunStatus(SUCCESS, "; ".join(notes))
