"""Plain-data reports of predictions, searches and calibrations (what --format json
prints and the tables show). Pure Python.
"""

from __future__ import annotations

from .. import metrics
from ..catalog import hardware, references
from ..plan import Plan
from .calibrate import FitResult
from .device import GIB
from .perf import PART_LABELS, StepPrediction
from .search import Candidate, SearchResult


def layout_dict(plan: Plan) -> dict:
    lay = plan.layout
    return {"tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "dp": lay.dp, "vp": lay.vp,
            "dp_shard": lay.dp_shard, "mbs": plan.mbs, "gbs": plan.gbs, "ga": plan.ga,
            "seq_len": plan.seq_len, "recompute": plan.recompute,
            "dp_sharding": plan.dp_sharding}


def published_reference(plan: Plan, overrides: dict) -> references.Reference | None:
    """The published cell this plan reproduces, when it is the recipe's own plan."""
    if overrides:
        return None
    return references.find_reference(plan.workload, plan.size, plan.dtype, plan.gpus,
                                     plan.gpu_type)


def prediction_dict(plan: Plan, pred: StepPrediction, *, overrides: dict | None = None,
                    calibrated: bool = False, figures: dict | None = None,
                    profile: str | None = None) -> dict:
    mem = pred.memory
    out = {
        "workload": plan.workload, "size": plan.size, "dtype": plan.dtype,
        "gpu": plan.gpu_type, "scale": plan.gpus, "layout": layout_dict(plan),
        "sharding": pred.sharding,
        "sharding_assumption": mem.assumption,
        "step_time_s": pred.step_time_s,
        "tokens_per_s": pred.tokens_per_s,
        "tflops_per_gpu": pred.tflops_per_gpu,
        **_mfu_fields(pred.mfu, pred.mfu_causal, plan),
        "mfu_convention": "published",
        "hardware_tflops_per_gpu": pred.hardware_tflops_per_gpu,
        "days_per_1t_tokens": pred.days_per_1t_tokens,
        "bubble_fraction": pred.bubble_fraction,
        "critical_pipeline_rank": pred.critical_rank,
        "microbatches": pred.microbatches,
        "breakdown": {k: {"seconds": v, "share": pred.shares[k]}
                      for k, v in pred.breakdown.items()},
        "compute_breakdown_s": dict(pred.compute_breakdown),
        "memory_gib": mem.total_gib,
        "memory_capacity_gib": mem.capacity / GIB if mem.capacity else None,
        "fits": mem.fits,
        "memory_breakdown_gib": mem.parts_gib(),
        "memory_rank": mem.rank,
        "in_flight_microbatch_chunks": mem.in_flight,
        "constants": pred.constants,
        "constants_source": ("hardware profile " + profile if profile
                             else "calibrated" if calibrated else "defaults"),
        # The scan's efficiency only where the model runs the scan (Nemotron-H).
        "hardware_figures": {name: where for name, where in (figures or {}).items()
                             if name != "scan_eff" or pred.compute_breakdown.get("scan")},
        "hardware_profile": profile,
    }
    ref = published_reference(plan, overrides or {})
    if ref is not None:
        out["published_step_time_s"] = ref.step_time_s
        out["error_vs_published"] = pred.step_time_s / ref.step_time_s - 1
    return out


def _mfu_fields(mfu: float, mfu_causal: float, plan: Plan) -> dict:
    """mfu and mfu_causal as fractions; one above 1 is impossible (metrics.mfu_problem):
    it becomes None, with its value in <key>_invalid and the reason in <key>_problem."""
    out = {"mfu": mfu, "mfu_causal": mfu_causal}
    peak = hardware.GPUS[plan.gpu_type].peak(plan.dtype) if plan.gpu_type in hardware.GPUS \
        else None
    for key in ("mfu", "mfu_causal"):
        problem = metrics.mfu_problem(100 * out[key], peak, "catalog")
        out[f"{key}_problem"] = problem
        if problem:
            out[f"{key}_invalid"], out[key] = out[key], None
    return out


def candidate_dict(rank: int, cand: Candidate) -> dict:
    p = cand.prediction
    return {"rank": rank, "layout": layout_dict(cand.plan), "describe": cand.describe(),
            "step_time_s": p.step_time_s, "tokens_per_s": p.tokens_per_s,
            **_mfu_fields(p.mfu, p.mfu_causal, cand.plan),
            "memory_gib": p.memory.total_gib, "why": cand.why(),
            "shares": p.shares}


def search_dict(result: SearchResult, top: int) -> dict:
    best = result.best_per_layout()
    return {
        "considered": result.considered,
        "invalid": result.invalid,
        "not_fitting": result.not_fitting,
        "within_headroom": result.tight,
        "headroom": result.headroom,
        "ranked_variants": len(result.ranked),
        "layouts": len(best),
        "recipe_layout": None if result.recipe_key is None else dict(
            zip(("tp", "pp", "cp", "vp", "mbs", "recompute", "dp_sharding"),
                result.recipe_key)),
        "recipe_layout_rank": (result.layout_rank_of(result.recipe_key)
                               if result.recipe_key else None),
        "recipe_variant_rank": result.rank_of(result.recipe_key) if result.recipe_key else None,
        "top": [candidate_dict(i, c) for i, c in enumerate(best[:top], 1)],
    }


def calibration_dict(result: FitResult) -> dict:
    return {
        "gpu": result.gpu_type,
        "runs": len(result.runs),
        "mean_abs_error_pct_before": result.mean_abs_before_pct,
        "max_abs_error_pct_before": result.max_abs_before_pct,
        "mean_abs_error_pct_after": result.mean_abs_after_pct,
        "max_abs_error_pct_after": result.max_abs_after_pct,
        "fitted": result.fitted,
        "per_run": [{"run": r.source, "measured_s": r.step_time_s,
                     "error_before": b, "error_after": a}
                    for r, b, a in zip(result.runs, result.errors_before, result.errors_after)],
    }


def part_label(part: str) -> str:
    return PART_LABELS.get(part, part)
