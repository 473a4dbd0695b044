"""What a trainbench run recorded about itself beyond its steps, in a result: profiling's
cost measured on the run, the slowest rank (run.json `straggler`), energy and throttling
and a GPU another process shared (run.json `telemetry`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..conditions import SHARED_GPU_LINE

if TYPE_CHECKING:
    from .rundir import RunFacts
    from .summary import ExperimentResult


def profiled_iterations(features: dict) -> tuple[range, set[int]]:
    """(iterations a profiled run traced, iterations the profiler touched before them).

    torch.profiler is prepared (its warm-up: Kineto, and CUPTI on a GPU, already
    collecting) before the step ahead of the first traced one (engine/profiling.py), so
    that step is neither clean nor traced; nsys has no warm-up step.
    """
    mode = features.get("profile")
    if not mode:
        return set(), set()
    try:
        start, stop = int(features.get("profile_start", 0)), int(features.get("profile_stop", -1))
    except (TypeError, ValueError, OverflowError):
        return range(0), set()
    # A range, never a set: a plan.json may name any span, and `in`, min and max on a
    # range cost nothing.
    traced = range(start, stop + 1)
    return traced, ({start - 1} if mode == "torch" and start > 0 else set())


def profiling_overhead(result: ExperimentResult, facts: RunFacts) -> None:
    """Profiling's cost measured on the run itself: its traced steps in the window against
    its unprofiled steps there, so a profiled figure is never trusted blindly."""
    features = (facts.plan or {}).get("features") or {}
    traced, warmup = profiled_iterations(features)
    if not traced or result.window is None or result.step_time_mean_s is None:
        return
    first, last = result.window
    times = {r.iteration: r.step_time_s for r in result.records
             if first <= r.iteration <= last and r.step_time_s is not None
             and math.isfinite(r.step_time_s)}
    profiled = [t for it, t in times.items() if it in traced]
    clean = [t for it, t in times.items() if it not in traced and it not in warmup]
    span = f"{min(traced)}-{max(traced)}"
    inside = sorted(it for it in times if it in traced)
    if inside and (inside[0], inside[-1]) != (min(traced), max(traced)):
        span = f"{inside[0]}-{inside[-1]} (of {span}, the rest outside the window)"
    if not profiled:
        result.profiling_overhead = (f"not measured: the profiled iterations {span} lie "
                                     f"outside the window {first}-{last} (pass --window)")
    elif not clean:
        result.profiling_overhead = (f"no unprofiled steps to compare: the window {first}-"
                                     f"{last} holds only profiled iterations ({span})"
                                     + (f" and the profiler's warm-up step {min(warmup)}"
                                        if warmup else ""))
    else:
        mean_p, mean_c = sum(profiled) / len(profiled), sum(clean) / len(clean)
        result.profiling_overhead_pct = 100 * (mean_p / mean_c - 1)
        result.profiling_overhead = (
            f"{result.profiling_overhead_pct:+.1f}%: profiled iterations {span} "
            f"{mean_p:.4g} s/step ({len(profiled)} step(s)) vs {mean_c:.4g} s/step over the "
            f"window's {len(clean)} unprofiled step(s)"
            + (f" (warm-up step {min(warmup)} left out)" if warmup else ""))
    result.notes.append(f"profiling overhead {result.profiling_overhead}")


def straggler_note(result: ExperimentResult, facts: RunFacts) -> None:
    """The engine's per-rank compute times (run.json `straggler`): the spread always, the
    slowest rank named only past the engine's threshold."""
    from ..engine.straggler_text import describe
    record = (facts.run or {}).get("straggler")
    if not isinstance(record, dict) or not isinstance(record.get("slowest"), dict):
        return
    slow = record["slowest"]
    pct = slow.get("pct_above_median")
    result.rank_compute_spread_pct = float(pct) if isinstance(pct, (int, float)) else None
    if record.get("flagged") is True:
        result.straggler_rank = slow.get("rank")
        result.straggler_host = slow.get("host")
        try:
            result.straggler = describe(record)
        except (KeyError, TypeError, ValueError):  # a hand-edited or older record
            result.straggler = f"straggler: rank {slow.get('rank')} (host {slow.get('host')})"
        result.notes.append(result.straggler)


def telemetry(result: ExperimentResult, facts: RunFacts) -> None:
    """Energy per token and throttling from the engine's telemetry in run.json."""
    telemetry = (facts.run or {}).get("telemetry")
    if not isinstance(telemetry, dict):
        return
    energy = telemetry.get("energy_per_token_j")
    result.energy_per_token_j = float(energy) if isinstance(energy, (int, float)) else None
    throttled = telemetry.get("throttled")
    result.throttled = throttled if isinstance(throttled, bool) else None
    if result.throttled:
        reasons = ", ".join(telemetry.get("throttle_reasons") or []) or "reason not reported"
        what = "GPU" if telemetry.get("source") == "nvml" else "CPU"
        result.notes.append(f"{what} throttled during the timed window ({reasons}): its "
                            "timings reflect lowered clocks")
    shared = telemetry.get("gpu_shared")
    result.gpu_shared = shared if isinstance(shared, bool) else None
    if result.gpu_shared:
        where = telemetry.get("gpu_shared_nodes")
        result.notes.append(SHARED_GPU_LINE + (f" ({where})" if isinstance(where, str) else ""))
