"""A result's window statistics and metrics: step time over the window, tokens/s, TFLOPS,
MFU against the right peak (never one above 100% or from a peak that is no positive
number: metrics.mfu_problem), days to train and peak memory."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .. import flops as fl
from .. import metrics
from ..catalog import hardware
from ..rundir import PLAN_FILE, RUN_FILE
from .parse import LogScan
from .status import FAILED, INVALID

if TYPE_CHECKING:
    from .rundir import RunFacts
    from .summary import ExperimentResult


NO_PEAK_CPU_FP8 = "not applicable (CPU FP8 emulation: correctness only)"
"""peak_source of a CPU FP8 run: there is no peak to measure its emulated GEMMs against."""


def peak_of(result: ExperimentResult, facts: RunFacts) -> tuple[float | None, str | None]:
    run = facts.run or {}
    if run.get("mfu_not_applicable"):  # CPU FP8: an emulation, no peak to compare with
        result.notes.append(run["mfu_not_applicable"])
        return None, NO_PEAK_CPU_FP8
    for record, name, source in ((run, RUN_FILE, run.get("peak_source") or "run.json"),
                                 (facts.plan or {}, PLAN_FILE, "catalog")):
        if record.get("peak_tflops"):
            peak = positive_number(record["peak_tflops"])
            if peak is None:  # the note names the field, never its value (NaN, -1e9, ...)
                result.notes.append(f"{name} peak_tflops is not a positive number: no MFU")
                return None, None
            return peak, str(source)
    if facts.plan is not None:
        if result.gpu_type == hardware.CPU:
            result.notes.append("CPU run without run.json: no measured GEMM peak, no MFU")
        return None, None
    if result.gpu_type and result.dtype:
        try:
            peak = hardware.get_gpu(result.gpu_type).peak(result.dtype)
        except LookupError:
            return None, None
        return (peak, "catalog") if peak else (None, None)
    return None, None


def positive_number(value) -> float | None:
    """A JSON value as a positive, finite float; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def _flops_per_sequence(result: ExperimentResult, spec, convention: str) -> float | None:
    """The model's FLOPs per sequence, or None (with a note where the model's sizes give
    no finite count: a plan.json edited to a width of 10^400, or to zero heads)."""
    if spec is None:
        return None
    try:
        f = fl.flops_per_sequence(spec, result.seq_len, convention)
    except (ArithmeticError, ValueError, TypeError) as err:
        result.notes.append(f"no FLOPs count for this model's sizes ({type(err).__name__}): "
                            "no TFLOPS or MFU")
        return None
    if not math.isfinite(f):
        result.notes.append("no finite FLOPs count for this model's sizes: no TFLOPS or MFU")
        return None
    return f


def window_metrics(result: ExperimentResult, scan: LogScan, spec, convention: str,
                    facts: RunFacts, window_given: bool = False) -> None:
    records = scan.records
    peaks = [r.peak_memory_bytes for r in records if r.peak_memory_bytes]
    if scan.peak_memory_bytes:
        peaks.append(scan.peak_memory_bytes)
    if peaks:
        result.peak_memory_gib = max(peaks) / 2**30
    if result.window is None or not records or result.status in (FAILED, INVALID):
        return
    times = {r.iteration: r.step_time_s for r in records}
    stats = metrics.window_stats(times, result.window)
    if stats is None and not window_given:
        # An excerpt of a long run: the window scaled to its planned length holds none of
        # the steps the log has, so the steps present are used, and the note says so.
        first, last = records[0].iteration, records[-1].iteration
        result.notes.append(
            f"the default window {result.window_start}-{result.window_end} (scaled to "
            f"{result.total_iterations} planned iterations) holds none of the logged "
            f"iterations {first}-{last}: the {len(records)} step(s) present are used; pass "
            f"--window {first}-{last} (or another range of them) to choose")
        result.window_start, result.window_end = first, last
        stats = metrics.window_stats(times, result.window)
    if stats is None:
        result.notes.append(f"no step in window {result.window_start}-{result.window_end}")
        return
    result.window_count = stats.count
    result.step_time_mean_s, result.step_time_std_s = stats.mean, stats.std
    logged = metrics.window_stats({r.iteration: r.tflops_per_gpu for r in records
                                   if r.tflops_per_gpu is not None}, result.window)
    if logged is not None:
        result.log_tflops_per_gpu = logged.mean

    t = stats.mean
    if result.seq_len and result.gbs:
        result.tokens_per_s = metrics.tokens_per_second(result.seq_len, result.gbs, t)
        result.days_per_1t_tokens = metrics.days_to_train(result.tokens_per_s)
        if result.gpus:
            result.tokens_per_s_per_gpu = result.tokens_per_s / result.gpus
    peak, source = peak_of(result, facts)
    result.peak_tflops, result.peak_source = peak, source
    f = _flops_per_sequence(result, spec, convention)
    if f is not None and result.gbs and result.gpus:
        result.tflops_per_gpu = metrics.tflops_per_gpu(result.gbs, f, t, result.gpus)
        result.tflops_source = f"computed ({convention})"
        result.mfu_convention = convention
        if peak:
            result.mfu_pct = 100 * metrics.mfu(result.gbs, f, t, result.gpus, peak)
    elif result.log_tflops_per_gpu is not None:
        result.tflops_per_gpu = result.log_tflops_per_gpu
        result.tflops_source = "log"
        if peak:
            result.mfu_pct = 100 * result.tflops_per_gpu / peak
            result.mfu_convention = "log's own FLOPs"
    problem = metrics.mfu_problem(result.mfu_pct, peak, source)
    if problem:
        # Never a normal figure: tables, sorting, plots and the job history see no MFU.
        invalid = result.mfu_pct if math.isfinite(result.mfu_pct) else None
        result.mfu_invalid_pct, result.mfu_pct, result.mfu_problem = invalid, None, problem
        result.notes.append(problem)
    elif result.mfu_pct is not None and source == "measured GEMM":
        result.notes.append(f"MFU against the measured GEMM peak of {peak:.3g} TFLOPS "
                            "(no published peak for this device)")
