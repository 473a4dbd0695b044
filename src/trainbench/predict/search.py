"""Search the parallel layouts of a workload at a scale: enumerate TP, PP, VP, CP, MBS, the
recompute choice and (as trainbench's engine runs it) the data-parallel sharding, drop what
is invalid or does not fit, rank the rest by predicted step time (the global batch stays
fixed, so step time ranks throughput too).
Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog import hardware
from ..catalog.models import get_model
from ..overrides import CHOICE_KEYS
from ..plan import Plan, PlanError, layers_split_ok, pipeline_layers
from ..planning import build_plan, shape_model
from .context import ENGINE, MegatronRun, make_context
from .device import GIB
from .memory import memory_from_context
from .perf import StepPrediction, predict_from_context

RECOMPUTE = ("none", "selective", "full")
MBS_CHOICES = (1, 2, 4)
SEARCH_KEYS = ("tp", "pp", "cp", "vp", "mbs", "recompute", "dp_sharding")


@dataclass(frozen=True)
class Candidate:
    plan: Plan
    prediction: StepPrediction

    @property
    def key(self) -> tuple:
        lay = self.plan.layout
        return (lay.tp, lay.pp, lay.cp, lay.vp, self.plan.mbs, self.plan.recompute,
                self.plan.dp_sharding)

    def describe(self) -> str:
        lay = self.plan.layout
        text = f"TP{lay.tp} PP{lay.pp} CP{lay.cp} DP{lay.dp}"
        if lay.vp > 1:
            text += f" VP{lay.vp}"
        text += f" MBS{self.plan.mbs}"
        if self.plan.recompute != "none":
            text += f" recompute={self.plan.recompute}"
        if self.plan.dp_sharding != "full":
            text += f" dp_sharding={self.plan.dp_sharding}"
        return text

    def why(self) -> str:
        """The costs beyond compute that set this layout apart, and its memory."""
        p = self.prediction
        labels = {"tp_comm": "TP", "cp_comm": "CP", "ep_comm": "EP a2a", "pp_p2p": "PP p2p",
                  "bubble": "bubble", "dp_comm": "DP", "optimizer": "optimizer"}
        costs = sorted(((p.shares[k], name) for k, name in labels.items() if p.shares[k] >= 0.002),
                       reverse=True)
        parts = [f"{name} {100 * share:.1f}%" for share, name in costs[:3]]
        recompute = p.compute_breakdown.get("recompute", 0.0) / p.step_time_s
        if recompute >= 0.002:
            parts.append(f"recompute {100 * recompute:.1f}%")
        mem = p.memory
        cap = f"/{mem.capacity / GIB:.0f}" if mem.capacity else ""
        parts.append(f"memory {mem.total_gib:.0f}{cap} GiB")
        return ", ".join(parts) if parts else "compute only"


@dataclass
class SearchResult:
    ranked: list[Candidate]
    """Every valid layout that fits with headroom, fastest first."""
    considered: int = 0
    invalid: int = 0
    not_fitting: int = 0
    """Valid layouts predicted above the usable memory."""
    tight: int = 0
    """Valid layouts that fit, but by less than the headroom."""
    recipe_key: tuple | None = None
    headroom: float = 0.0

    def rank_of(self, key: tuple) -> int | None:
        """1-based rank of a layout among all ranked ones, None when it was dropped."""
        for i, cand in enumerate(self.ranked, 1):
            if cand.key == key:
                return i
        return None

    def best_per_layout(self) -> list[Candidate]:
        """The fastest variant of each (TP, PP, CP, MBS): the virtual-pipeline depth, the
        recompute choice and the data-parallel sharding are schedule and memory knobs, so
        each layout shows once, with its best VP, recompute and sharding."""
        seen, out = set(), []
        for cand in self.ranked:
            lay = cand.plan.layout
            family = (lay.tp, lay.pp, lay.cp, cand.plan.mbs)
            if family not in seen:
                seen.add(family)
                out.append(cand)
        return out

    def layout_rank_of(self, key: tuple) -> int | None:
        """1-based rank of a layout in best_per_layout(), None when it is not listed there
        (dropped, or another VP of its family is faster). Its data-parallel sharding is not
        compared: a recipe's framework shards its own way (--sharding)."""
        for i, cand in enumerate(self.best_per_layout(), 1):
            if cand.key[:-1] == key[:-1]:
                return i
        return None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_overrides(workload: str, size: str, scale: int, gpu_type: str,
                        fixed: dict, dp_shardings: tuple[str, ...] = ("full",)) -> list[dict]:
    """Layout overrides worth building: TP inside an NVLink domain and dividing the heads,
    PP and VP that split the layers, CP dividing the sequence (not for Mamba models), and
    each of `dp_shardings` where it differs (not under PP, which gathers once a step
    either way, nor without data or context parallel ranks to shard over)."""
    model = get_model(workload, size)
    model = shape_model(model, fixed.get("layers"), fixed.get("pattern"), fixed.get("experts"))
    per_node = fixed.get("gpus_per_node")
    if per_node is None and gpu_type != hardware.CPU:
        gpu = hardware.get_gpu(gpu_type)
        per_node = getattr(gpu, "nvlink_domain", 0) or gpu.gpus_per_node
    per_node = per_node or scale
    seq = fixed.get("seq_len", model.seq_len)
    layers = pipeline_layers(model)
    tps = [t for t in _divisors(min(per_node, scale)) if model.heads % t == 0
           and model.kv_heads % t == 0]
    cps = [c for c in (1, 2, 4, 8, 16) if c == 1 or (not model.is_hybrid and seq % (2 * c) == 0)]
    out = []
    for tp in ([fixed["tp"]] if "tp" in fixed else tps):
        for cp in ([fixed["cp"]] if "cp" in fixed else cps):
            if scale % (tp * cp):
                continue
            for pp in ([fixed["pp"]] if "pp" in fixed else _divisors(scale // (tp * cp))):
                if pp > layers:
                    continue
                vps = [v for v in range(1, layers + 1)
                       if (v == 1 or pp > 1) and layers_split_ok(layers, pp * v)]
                for vp in ([fixed["vp"]] if "vp" in fixed else vps):
                    for mbs in ([fixed["mbs"]] if "mbs" in fixed else MBS_CHOICES):
                        for rc in ([fixed["recompute"]] if "recompute" in fixed else RECOMPUTE):
                            dp = scale // (tp * cp * pp)
                            shardings = ([fixed["dp_sharding"]] if "dp_sharding" in fixed
                                         else dp_shardings if pp == 1 and dp * cp > 1
                                         else dp_shardings[:1])
                            for ds in shardings:
                                out.append(dict(tp=tp, cp=cp, pp=pp, vp=vp, mbs=mbs,
                                                recompute=rc, dp=dp, dp_sharding=ds))
    return out


# The memory model reproduces the seeds' measured peaks within 3% (tests/test_predict_memory.py);
# a search keeps layouts that fit with this much to spare.
DEFAULT_HEADROOM = 0.05


def search(workload: str, size: str, dtype: str, scale: int, gpu_type: str = "h100", *,
           overrides: dict | None = None, config: dict | None = None,
           sharding: str = "recipe", headroom: float = DEFAULT_HEADROOM,
           device=None, constants=None, megatron: MegatronRun = MegatronRun()
           ) -> SearchResult:
    """Valid layouts that fit with `headroom` (a fraction of usable memory) to spare,
    ranked by predicted step time.

    `overrides` (from --set) apply to every candidate; a searched key it sets is fixed.
    `device` and `constants` replace the catalog's (predict --hardware passes a probe's).
    """
    fixed = dict(overrides or {})
    if megatron.offload_layers:
        # Offloading is modelled at PP1 only (context.check_megatron_run): search that.
        fixed.setdefault("pp", 1)
    base = {k: v for k, v in fixed.items() if k not in SEARCH_KEYS + ("dp", "dp_shard")}
    result = SearchResult(ranked=[], headroom=headroom)
    try:
        recipe_plan = build_plan(workload, size, dtype, scale, gpu_type, overrides=dict(fixed))
        lay = recipe_plan.layout
        result.recipe_key = (lay.tp, lay.pp, lay.cp, lay.vp, recipe_plan.mbs,
                             recipe_plan.recompute, recipe_plan.dp_sharding)
        if "gbs" not in base:
            base["gbs"] = recipe_plan.gbs  # keep the recipe's global batch at this scale
    except PlanError:
        pass
    fits_all = []
    # The data-parallel sharding changes what the engine holds and sends; the recipe's
    # framework (--sharding recipe) has one of its own.
    shardings = CHOICE_KEYS["dp_sharding"] if sharding == ENGINE else ("full",)
    for layout in candidate_overrides(workload, size, scale, gpu_type, fixed, shardings):
        result.considered += 1
        try:
            plan = build_plan(workload, size, dtype, scale, gpu_type,
                              overrides={**base, **layout})
        except PlanError:
            result.invalid += 1
            continue
        ctx = make_context(plan, sharding=sharding, config=config, device=device,
                           constants=constants, megatron=megatron)
        mem = memory_from_context(ctx)
        if mem.fits is False:
            result.not_fitting += 1
            continue
        if mem.capacity is not None and mem.total > (1 - headroom) * mem.capacity:
            result.tight += 1
            continue
        fits_all.append(Candidate(plan, predict_from_context(ctx, memory=mem)))
    fits_all.sort(key=lambda c: c.prediction.step_time_s)
    result.ranked = fits_all
    return result
