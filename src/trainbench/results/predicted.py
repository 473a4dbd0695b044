"""predict's figures beside a trainbench run's measured ones. Every run on a GPU checks
the model that buyers plan with: a step time or peak memory further than MISMATCH from
predict's, for the run's own plan, is a finding, said in the run's notes. Pure Python, no
torch.

A CPU run gets none: predict has no step-time model for a CPU (no published peak), and
a CPU run's peak memory is its process's resident set, libraries included, which the
memory model does not describe."""

from __future__ import annotations

from dataclasses import replace

from ..catalog import hardware
from ..plan import Plan
from ..planning import validate
from ..predict.context import ENGINE
from ..predict.perf import predict_step
from .experiment import ExperimentResult
from .parse import StepRecord
from .status import SUCCESS

MISMATCH = 0.15
"""A measured figure further than this from predict's is a finding."""
ACCURACY_PAGE = "docs/predict-accuracy.md"


def predicted(plan: Plan) -> dict:
    """predict's step time, MFU (published FLOPs) and peak memory for the plan, with
    trainbench's engine as the sharding; None for each on a CPU or where predict has no
    figure for the plan (then `problem` says why)."""
    none = {"step_s": None, "mfu_pct": None, "memory_gib": None}
    if plan.device == "cpu":
        return none
    try:
        step = predict_step(plan, sharding=ENGINE)
    except (LookupError, ValueError, TypeError, ArithmeticError) as err:
        # Also a plan.json edited to sizes no model has (0 heads, a width of 10^400):
        # `results` reads any directory and must say what it can of it.
        return {**none, "problem": f"{type(err).__name__}: {err}"}
    return {"step_s": step.step_time_s, "mfu_pct": 100 * step.mfu,
            "memory_gib": step.memory.total_gib}


def plan_as_run(plan: Plan, run: dict | None) -> Plan | None:
    """The run directory's plan with the Mamba-2 scan its run.json says ran (a plan's
    `auto` runs the torch scan where mamba_ssm does not import); None for a plan.json
    edited past the checks `run` and the engine make (a layer count of 10^12), which
    gets no prediction rather than a model of it."""
    try:
        if validate(plan, plan.gpus, hardware.GPUS.get(plan.gpu_type)):
            return None
    except (TypeError, ValueError, ArithmeticError):
        return None
    scan = (run or {}).get("ssd_scan")
    if plan.ssd_scan == "auto" and isinstance(scan, str) and scan.startswith("torch"):
        plan = replace(plan, ssd_scan="torch")
    return plan


def allocated_peak_gib(records: list[StepRecord]) -> float | None:
    """The largest allocated peak the run's steps recorded, in GiB; None where none did
    (a CPU run, a run from before metrics.jsonl recorded it, another tool's log)."""
    peaks = [r.peak_allocated_bytes for r in records if r.peak_allocated_bytes]
    return max(peaks) / 2**30 if peaks else None


def gap(measured: float | None, predicted_value: float | None) -> float | None:
    """measured / predicted - 1, or None where either is missing."""
    return None if measured is None or not predicted_value else measured / predicted_value - 1


def predict_beside(result: ExperimentResult, plan: Plan, run: dict | None) -> None:
    """predict's figures for a trainbench GPU run's plan (a comparable run: not profiled
    or traced), and for a successful one their gaps, with a note for each gap over
    MISMATCH."""
    if not result.comparable:
        return
    plan = plan_as_run(plan, run)
    if plan is None or plan.device == "cpu":
        return
    figures = predicted(plan)
    result.predicted_step_time_s = figures["step_s"]
    result.predicted_mfu_pct = figures["mfu_pct"]
    result.predicted_memory_gib = figures["memory_gib"]
    if result.status != SUCCESS:
        return
    allocated = allocated_peak_gib(result.records)
    memory = allocated if allocated is not None else result.peak_memory_gib
    result.predicted_memory_basis = "allocated" if allocated is not None else "reserved"
    checks = (("step time", result.step_time_mean_s, figures["step_s"], "s", "step_time"),
              (f"peak memory ({result.predicted_memory_basis})", memory,
               figures["memory_gib"], "GiB", "memory"))
    for what, measured, want, unit, field in checks:
        off = gap(measured, want)
        if off is None:
            continue
        setattr(result, f"{field}_vs_predicted_pct", 100 * off)
        if abs(off) > MISMATCH:
            result.notes.append(
                f"finding: {what} {measured:.4g} {unit} is {round(100 * off):+d}% from predict's "
                f"{want:.4g} {unit} for this plan (more than {100 * MISMATCH:.0f}%; what "
                f"predict models: {ACCURACY_PAGE})")


def predicted_line(result: ExperimentResult) -> str:
    """predict's figures and the measured ones' gaps, for the run's closing table:
    '0.4224 s a step (measured +33%), 62.05 GiB (measured +36%, reserved)'."""
    parts = []
    for value, unit, off, basis in (
            (result.predicted_step_time_s, "s a step", result.step_time_vs_predicted_pct, ""),
            (result.predicted_memory_gib, "GiB", result.memory_vs_predicted_pct,
             f", {result.predicted_memory_basis}")):
        if value is not None:
            measured = "" if off is None else f" (measured {round(off):+d}%{basis})"
            parts.append(f"{value:.4g} {unit}{measured}")
    return ", ".join(parts)
