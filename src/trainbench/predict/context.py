"""Everything both models derive from a plan once: device, constants, sharding, the work
of each layer kind and how layers sit on pipeline ranks. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..catalog import recipes
from ..plan import FP8_DTYPES, Plan
from .comm import ALL_TO_ALL, PER_NODE, Groups, groups_for
from .constants import Constants, constants_for
from .device import Device, device_for
from .work import LayerWork, Shape, layer_work, pipeline_chunks, rank_chunks

# How the framework shards model state over data-parallel ranks.
DISTRIBUTED_OPTIMIZER = "distributed_optimizer"
"""Megatron-LM's distributed optimizer (ZeRO-1): bf16 weights and gradients on every
data-parallel rank, fp32 master weights and Adam moments sharded over DP x CP."""
FSDP = "fsdp"
"""FSDP / ZeRO-3 (trainbench's engine with FSDP2, MaxText): weights, gradients and
optimizer state sharded; weights all-gathered per layer, gradients reduce-scattered.
HSDP where the plan names dp_shard groups (MaxText's Llama 2 beyond 256 GPUs)."""
ENGINE = "engine"
"""What trainbench's engine runs: FSDP2 over all dp x cp ranks of every multi-rank layout.
The engine builds no HSDP groups, so a plan's dp_shard does not apply; on one rank
nothing is sharded. `trainbench run` and `predict` both assume it by default, so one
plan gets one memory figure."""
SHARDINGS = (ENGINE, "recipe", DISTRIBUTED_OPTIMIZER, FSDP)

# Recipes whose framework shards with FSDP; every other seed recipe runs Megatron-LM (NeMo).
FSDP_RECIPES = (recipes.SEED_LLAMA2, recipes.TINY)


FLEX_DISPATCHER, ALLTOALL_DISPATCHER = "flex", "alltoall"
MOE_DISPATCHERS = (FLEX_DISPATCHER, ALLTOALL_DISPATCHER)


@dataclass(frozen=True)
class MegatronRun:
    """What a Megatron-LM run did that a plan does not say, and trainbench's engine does not
    do: `predict --loss te --offload-layers N --moe-dispatcher D` for the runs behind
    NVIDIA's later tables (catalog.heldout, "Recipe facts beyond the tables"). The default
    is how the seeds ran (NeMo 24.09-25.04): Megatron's unfused loss, nothing offloaded,
    and the flex dispatcher of NVIDIA's MoE recipes."""
    fused_loss: bool = False
    """Transformer Engine's fused cross entropy (work.Shape.fused_loss)."""
    offload_layers: int = 0
    """Transformer layers whose activations the run kept in host memory (Megatron's
    `cpu_offloading_num_layers`): the first ones of the model. Their transfers overlap
    compute in the recipes and are not charged."""
    moe_dispatcher: str = "flex"
    """How the run's MoE tokens reached their experts: 'flex' (Megatron-Core's flex
    dispatcher with DeepEP or HybridEP, a token sent once per remote node: comm's
    per-node dispatch) or 'alltoall' (its alltoall dispatcher, a row per chosen expert,
    as Megatron-Bridge's Qwen3 235B-A22B H100 rows ran: catalog.heldout)."""

    @property
    def default(self) -> bool:
        return self == MegatronRun()

    def describe(self) -> str:
        parts = []
        if self.moe_dispatcher == ALLTOALL_DISPATCHER:
            parts.append("MoE tokens through Megatron-Core's alltoall dispatcher (a row per "
                         "chosen expert)")
        if self.fused_loss:
            parts.append("the loss as Transformer Engine's fused cross entropy (2 B per logit)")
        if self.offload_layers:
            n = self.offload_layers
            parts.append(f"the activations of the first {n} layer{'s' if n > 1 else ''} in "
                         "host memory (Megatron's cpu_offloading_num_layers; the transfers "
                         "not charged)")
        return "; ".join(parts)


def check_megatron_run(plan: Plan, sharding: str, run: MegatronRun) -> None:
    """ValueError, in one line, where `run` cannot describe the plan's run."""
    if run.default:
        return
    flags = " and ".join(f for f, on in (("--loss te", run.fused_loss),
                                        (f"--offload-layers {run.offload_layers}",
                                         run.offload_layers),
                                        (f"--moe-dispatcher {run.moe_dispatcher}",
                                         run.moe_dispatcher != FLEX_DISPATCHER)) if on)
    if run.moe_dispatcher not in MOE_DISPATCHERS:
        raise ValueError(f"--moe-dispatcher {run.moe_dispatcher}: unknown; expected one of "
                         + ", ".join(MOE_DISPATCHERS))
    if sharding == ENGINE:
        raise ValueError(f"{flags}: a setting of a Megatron-LM run, which trainbench's engine "
                         "does not have; add --sharding recipe (or distributed_optimizer / "
                         "fsdp)")
    if sharding == "recipe" and plan.recipe_source in FSDP_RECIPES:
        raise ValueError(f"{flags}: a setting of a Megatron-LM run, and the recipe of "
                         f"{plan.workload} {plan.size} is not one ({plan.recipe_source}); "
                         "add --sharding distributed_optimizer or fsdp to predict a "
                         "Megatron run of this plan")
    if run.moe_dispatcher != FLEX_DISPATCHER and not plan.model.is_moe:
        raise ValueError(f"--moe-dispatcher {run.moe_dispatcher}: a setting of an MoE run, and "
                         f"{plan.workload} {plan.size} has no experts; drop it")
    layers = plan.model.layers
    if run.offload_layers < 0:
        raise ValueError(f"--offload-layers {run.offload_layers}: must be 0 or more")
    if run.offload_layers >= layers:
        raise ValueError(f"--offload-layers {run.offload_layers}: Megatron offloads fewer "
                         f"layers than the model has ({layers})")
    if run.offload_layers and plan.layout.pp > 1:
        raise ValueError(f"--offload-layers is modelled at PP1 only (every published recipe "
                         f"that offloads runs PP1); this plan has PP{plan.layout.pp}")


def resolve_sharding(plan: Plan, sharding: str = "recipe") -> str:
    """'recipe' picks what the plan's recipe ran under: FSDP for MaxText (Llama 2) and
    trainbench's tiny proxies, Megatron's distributed optimizer for the NeMo recipes;
    'engine' is FSDP (without the plan's HSDP groups, see make_context)."""
    if sharding not in SHARDINGS:
        raise ValueError(f"unknown sharding {sharding!r}; use one of {', '.join(SHARDINGS)}")
    if sharding == ENGINE:
        return FSDP
    if sharding != "recipe":
        return sharding
    return FSDP if plan.recipe_source in FSDP_RECIPES else DISTRIBUTED_OPTIMIZER


@dataclass(frozen=True)
class Context:
    plan: Plan
    device: Device | None
    """None for a device without a description (a CPU): memory only, no step time."""
    constants: Constants
    sharding: str
    shape: Shape
    work: dict[str, LayerWork]
    """Work of one layer of each kind for one microbatch on one GPU."""
    chunks: list[list[str]]
    """Layer kinds of every virtual pipeline stage."""
    ranks: list[list[list[str]]]
    """Virtual stages of each pipeline rank."""
    groups: Groups
    requested_sharding: str = "recipe"
    """The sharding asked for ('engine', 'recipe', ...), before resolve_sharding."""
    megatron: MegatronRun = MegatronRun()

    @property
    def ep_dispatch(self) -> str:
        """How MoE tokens reach their experts (comm.moe_dispatch_s): 'per_node' for a
        Megatron-LM run with the flex dispatcher (most of NVIDIA's MoE performance recipes:
        DeepEP on H100 in 25.09, the flex dispatcher's DeepEP / HybridEP backends from
        25.11 on: Megatron-Bridge scripts/performance, run_script.py @fa0315a and
        configs/{deepseek,qwen}/*_workload_base_configs.py @5776a6d, c0b9a00, 21d102f),
        'all_to_all' for one with the alltoall dispatcher (MegatronRun.moe_dispatcher) and
        for the engine (one all_to_all_single row per chosen expert)."""
        megatron = self.sharding == DISTRIBUTED_OPTIMIZER
        return PER_NODE if megatron and self.megatron.moe_dispatcher == FLEX_DISPATCHER \
            else ALL_TO_ALL

    @property
    def microbatches(self) -> int:
        return self.plan.ga

    @cached_property
    def rank_counts(self) -> list[list[dict[str, int]]]:
        """Layers of each kind in each virtual stage of each pipeline rank."""
        out = []
        for rank in self.ranks:
            counted = []
            for chunk in rank:
                counts: dict[str, int] = {}
                for kind in chunk:
                    counts[kind] = counts.get(kind, 0) + 1
                counted.append(counts)
            out.append(counted)
        return out


def make_context(plan: Plan, *, sharding: str = "recipe", config: dict | None = None,
                 constants: Constants | None = None, device: Device | None = None,
                 need_device: bool = True, megatron: MegatronRun = MegatronRun()
                 ) -> Context:
    """LookupError when the plan's GPU type has no device description (CPU, unknown) and
    `need_device` is set; otherwise such a context has device None. ValueError where
    `megatron` does not describe the plan's run (check_megatron_run)."""
    check_megatron_run(plan, sharding, megatron)
    dev = device
    if dev is None:
        try:
            dev = device_for(plan.gpu_type, plan.gpus_per_node, config)
        except LookupError:
            if need_device:
                raise
    consts = constants or constants_for(plan.gpu_type, config)
    lay = plan.layout
    shape = Shape(mbs=plan.mbs, seq_len=plan.seq_len, tp=lay.tp, cp=lay.cp,
                  act_bytes=4 if plan.dtype == "fp32" else 2, fp8=plan.dtype in FP8_DTYPES,
                  ep=lay.ep, engine=sharding == ENGINE, fused_loss=megatron.fused_loss,
                  fp8_input_kept=plan.dtype == "fp8" and plan.fp8_recipe == "tensorwise"
                  and not plan.compile)
    kinds = {"embedding", "head"} | {k for k, n in plan.model.layer_counts().items()
                                     if n and k != "block"}
    work = {k: layer_work(plan.model, k, shape) for k in sorted(kinds)}
    chunks = pipeline_chunks(plan.model, lay.pp, lay.vp, lay.pp_split)
    dp_shard = 0 if sharding == ENGINE else lay.dp_shard
    return Context(plan=plan, device=dev, constants=consts,
                   sharding=resolve_sharding(plan, sharding), shape=shape, work=work,
                   chunks=chunks, ranks=rank_chunks(chunks, lay.pp),
                   groups=groups_for(lay.tp, lay.cp, lay.dp, lay.pp, dp_shard, lay.ep),
                   requested_sharding=sharding, megatron=megatron)
