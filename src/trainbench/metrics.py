"""Throughput metrics and step-window statistics, as the seeds define them. Pure Python."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

SECONDS_PER_DAY = 86400.0
ONE_TRILLION = 1e12


def tokens_per_second(seq_len: int, global_batch: int, step_time_s: float) -> float:
    """(sequence length) * (global batch size) / (step time), the seeds' throughput."""
    return seq_len * global_batch / step_time_s


def tflops_per_gpu(global_batch: int, flops_per_sequence: float, step_time_s: float,
                   gpus: int) -> float:
    return global_batch * flops_per_sequence / step_time_s / gpus / 1e12


def mfu(global_batch: int, flops_per_sequence: float, step_time_s: float, gpus: int,
        peak_tflops: float) -> float:
    """Model FLOPs utilisation as a fraction: GBS * F / t / N / peak (the seeds' formula)."""
    return tflops_per_gpu(global_batch, flops_per_sequence, step_time_s, gpus) / peak_tflops


# MFU is a share of the device's peak: above 1 (100%) it is impossible, so the peak it was
# measured against is wrong (a CPU GEMM benchmark that missed the fast path, a wrong
# --peak-tflops, a GPU taken for another). Such a figure is never shown as a number.
MFU_CEILING_PCT = 100.0


def mfu_problem(mfu_pct: float | None, peak_tflops: float | None = None,
                peak_source: str | None = None) -> str | None:
    """None for a possible MFU (or none at all); else the one line to show instead of it.

    The single rule every place that prints an MFU (run summary, results, jobs, plots,
    predict) calls, so they cannot disagree.
    """
    if mfu_pct is None or (math.isfinite(mfu_pct) and 0.0 <= mfu_pct <= MFU_CEILING_PCT):
        return None
    source = f" ({peak_source})" if peak_source else ""
    fix = "give the device's real dense peak (run --peak-tflops) or its right type (--gpu)"
    # The line never shows a NaN, an infinity or a negative figure: only what is wrong.
    if peak_tflops is not None and not (math.isfinite(peak_tflops) and peak_tflops > 0):
        return f"INVALID: MFU not computed: the peak{source} is not a positive number; {fix}"
    peak = f" of {peak_tflops:.4g} TFLOPS{source}" if peak_tflops else ""
    if not math.isfinite(mfu_pct) or mfu_pct < 0:
        return (f"INVALID: MFU is not a share of 0-100%{peak}: the step time or the peak must "
                f"be wrong; {fix}")
    return f"INVALID: MFU {mfu_pct:.4g}%{peak} is above 100%, so the peak must be wrong; {fix}"


def days_to_train(tokens_per_s: float, total_tokens: float = ONE_TRILLION) -> float:
    return total_tokens / tokens_per_s / SECONDS_PER_DAY


# The seeds analyse iterations 11-44 of a 50-step run (seed 004, parse_train_timing.sh).
SEED_WINDOW = (11, 44)
SEED_RUN_LENGTH = 50


def default_window(total_steps: int) -> tuple[int, int]:
    """The seeds' window 11-44 of 50, scaled to another run length (0-based iterations).

    A run too short to skip a warm-up still gets a window: its last iteration at least.
    """
    last = total_steps - 1
    start = round(total_steps * SEED_WINDOW[0] / SEED_RUN_LENGTH)
    end = round(total_steps * SEED_WINDOW[1] / SEED_RUN_LENGTH)
    end = min(max(end, 0), last)
    start = min(max(start, 0), end)
    return start, end


def parse_window(text: str) -> tuple[int, int]:
    """'11-44' -> (11, 44); ValueError with a fix on anything else."""
    try:
        a, b = (int(part) for part in text.split("-"))
    except ValueError:
        raise ValueError(f"window {text!r} is not of the form A-B (e.g. 11-44)") from None
    if a < 0 or b < a:
        raise ValueError(f"window {text!r} must have 0 <= A <= B")
    return a, b


@dataclass(frozen=True)
class WindowStats:
    start: int
    end: int
    count: int
    mean: float
    std: float
    """Sample standard deviation (n-1); 0 for a single value."""
    min: float
    max: float

    def to_dict(self) -> dict:
        return asdict(self)


def window_stats(values_by_iteration: dict[int, float], window: tuple[int, int]) -> WindowStats | None:
    """Statistics over iterations start..end inclusive; None when the window is empty."""
    start, end = window
    values = [v for it, v in sorted(values_by_iteration.items()) if start <= it <= end]
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return WindowStats(start, end, len(values), statistics.fmean(values), std, min(values),
                       max(values))
