"""The plan: one frozen, validated description of a run, and the only contract between
the launcher and the engine (it travels as plan.json in the experiment directory).

Built from a recipe row plus user overrides (`--set tp=2 gbs=64`). Every problem is
found here, before anything launches, and reported as one clear line each.
Pure Python, no torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from .catalog import hardware
from .catalog.models import ModelSpec

DTYPES = ("bf16", "fp8", "fp32", "mxfp8")
FP8_DTYPES = ("fp8", "mxfp8")
"""Dtypes whose linear layers run FP8 GEMMs through torchao (engine/parallel/float8.py).
mxfp8 is block-scaled FP8 (one power-of-two scale per 32 values): Blackwell tensor cores,
and on a CPU torchao's emulation; it runs the fp8 recipe rows' layouts."""
FP8_RECIPES = ("tensorwise", "rowwise")
"""torchao float8 scaling for --dtype fp8 (engine/parallel/float8.py); tensorwise first,
the default: NeMo's FP8 "current scaling"."""


class PlanError(ValueError):
    """Invalid input; `problems` holds one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    """Tensor (and sequence) parallel degree."""
    pp: int = 1
    """Pipeline stages."""
    cp: int = 1
    """Context parallel degree (sequence split across ranks)."""
    ep: int = 1
    """Expert parallel degree: neighbouring ranks of a stage (tp fastest, then cp, dp) that
    split the routed experts."""
    dp: int = 1
    """Data parallel degree (FSDP2 shards parameters over it)."""
    vp: int = 1
    """Virtual pipeline stages per rank (interleaved 1F1B when > 1)."""
    dp_shard: int = 0
    """Ranks each FSDP group shards over (HSDP); 0 = shard over all of dp."""
    pp_split: str = ""
    """Megatron's pipeline layout string (pp_split.py) placing the layers on the PP x VP
    stages; '' splits them evenly (or with the embedding and loss counted as layers)."""

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    def describe(self) -> str:
        text = f"TP{self.tp} PP{self.pp} CP{self.cp} DP{self.dp}"
        if self.ep > 1:
            text += f" EP{self.ep}"  # not a factor of the world: it spans tp x cp x dp
        if self.vp > 1:
            text += f" VP{self.vp}"
        if self.dp_shard and self.dp_shard != self.dp:
            # The recipe's HSDP; trainbench's engine runs one FSDP group over dp x cp
            # (its memory check says so), so the groups are the recipe's, not the run's.
            text += f" (recipe: FSDP groups of {self.dp_shard}; the engine shards over all DP)"
        return text


@dataclass(frozen=True)
class Features:
    profile: str = ""
    """'' (off), 'torch' (torch.profiler) or 'nsys'."""
    profile_start: int = 20
    profile_stop: int = 25
    profile_ranks: tuple[int, ...] = (0,)
    nccl_trace: bool = False
    checkpoint: bool = False
    """Save model, optimizer, step and RNG state at the end of the run."""
    checkpoint_interval: int = 0
    """Also save every N steps (0 = only at the end)."""
    load_checkpoint: str = ""
    """Checkpoint directory to restore before training."""


@dataclass(frozen=True)
class Plan:
    workload: str
    size: str
    dtype: str
    gpu_type: str
    """Key of catalog.hardware.GPUS, or 'cpu'."""
    model: ModelSpec
    layout: Layout
    mbs: int
    gbs: int
    seq_len: int
    steps: int
    gpus_per_node: int
    peak_tflops: float | None = None
    """Peak dense TFLOPS for MFU; None on a CPU, where the engine measures a GEMM peak."""
    features: Features = field(default_factory=Features)
    name: str = ""
    """Experiment name, e.g. pretrain_llama3.1_8b_bf16_gpus8."""
    out_dir: str = ""
    seed: int = 1234
    lr: float = 3e-4
    min_lr: float = 3e-5
    warmup_steps: int = 0
    """Linear warm-up steps; 0 picks the seeds' habit of a short warm-up (see schedule)."""
    recompute: str = "none"
    """Activation recomputation: 'none', 'selective' or 'full'."""
    compile: bool = False
    """torch.compile per block. build_plan resolves it by device unless --set gives it."""
    compile_source: str = "default"
    """'default' (resolved by the device: on for CUDA GPUs, off on a CPU) or 'set' (--set
    compile=...), kept apart so the log and run.json say which decided."""
    fsdp_prefetch: bool = True
    """FSDP2's all-gathers issued one block ahead, forward and backward (see fsdp.py)."""
    reduce_dtype: str = "fp32"
    """dtype of FSDP's gradient reduce-scatter: 'fp32' (default) or 'bf16'."""
    dp_sharding: str = "full"
    """What the data-parallel ranks shard during a step (the ZeRO stages of Rajbhandari et
    al. 2020). 'full' (FSDP2 as ZeRO-3): each block's weights are gathered for its forward
    and again for its backward, and its gradients reduce-scattered, every microbatch.
    'gradients' (ZeRO-2): the weights are gathered once a step and kept; the gradients are
    reduce-scattered every microbatch. 'optimizer' (ZeRO-1): the weights are gathered once
    a step and kept, the gradients accumulate whole (in reduce_dtype) and are
    reduce-scattered once, after the step's last backward; only the fp32 master weights
    and AdamW's moments stay sharded: the memory layout of Megatron's distributed
    optimizer, which the NeMo seeds ran. A pipeline runs as 'optimizer' under any of them
    (torch's schedules defer resharding and reduction to the last microbatch)."""
    dp_sharding_source: str = "default"
    """What chose dp_sharding and reduce_dtype: 'default' (the engine's defaults, 'full'
    and fp32), 'set' (--set gave either) or 'recipe' (a Megatron recipe row's own state
    sharding, recipe_sharding: the closest to Megatron's distributed optimizer that the
    memory model says fits). dp_sharding_label says it in words."""
    async_tp: bool = False
    """Asynchronous tensor parallel (inductor's micro-pipelined TP); CUDA, NCCL, compile."""
    cp_impl: str = "allgather"
    """Context parallel attention: 'allgather' (keys/values gathered) or 'ring' (PyTorch's
    ring attention, CUDA kernels only)."""
    fp8_recipe: str = FP8_RECIPES[0]
    ssd_scan: str = "auto"
    """The Mamba-2 scan a hybrid model runs on CUDA: 'kernel' (mamba_ssm's Triton SSD
    kernels, refused at start where they do not import), 'torch' (the engine's chunked
    scan, compiled with the block) or 'auto' (the kernel where it imports). predict
    charges the scan the plan names, and 'auto' as the kernel."""
    adam_moments: str = "fp32"
    """dtype of AdamW's two moments: 'fp32', or 'bf16' where the recipe keeps them so
    (Megatron's precision-aware optimizer, Apex's bf16-state Adam)."""
    master_weights: str = "fp32"
    """dtype of the parameters the optimizer updates: 'fp32' (master weights beside the
    bf16 compute copies FSDP gathers), or 'bf16' where the recipe kept no fp32 copy (Apex's
    DistributedFusedAdam with bf16 state, catalog.recipes.APEX_BF16_ADAM_RECIPES): the
    bf16 parameters are the only copy, updated in place with one rounding per step.
    Parameters that a module reads in fp32 whatever the compute dtype (Mamba-2's
    dt_bias, A_log, D) stay fp32."""
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment for the ranks (`--env K=V`)."""
    recipe_source: str = ""
    recipe_note: str = ""

    @property
    def gpus(self) -> int:
        return self.layout.world_size

    @property
    def sequence_shard_kept(self) -> bool:
        """Whether the engine's sequence-parallel gathers keep only the rank's shard for
        the backward and gather it again there (engine/parallel/tp.py, GatherSequence):
        always but under full recompute, whose block checkpoint keeps only the block's
        input anyway."""
        return self.recompute != "full"

    @property
    def weights_kept_gathered(self) -> bool:
        """The engine's FSDP units stay gathered from a step's first forward to its last
        backward: under PP (torch's schedules) and dp_sharding=gradients|optimizer."""
        return self.layout.pp > 1 or self.dp_sharding != "full"

    @property
    def one_rank_without_fsdp(self) -> bool:
        """A one-rank run has nothing to shard: FSDP's per-block hooks would cost about a
        third of a small model's step for nothing, so the engine runs the plain module
        under autocast. FP8 keeps FSDP: its bf16 compute comes from FSDP's mixed-precision
        policy on every layout, one rank included, so one FP8 process is the reference
        the parallel FP8 layouts are compared with."""
        return self.gpus == 1 and self.dtype not in FP8_DTYPES

    @property
    def gradients_reduced_once(self) -> bool:
        """The engine's gradients accumulate whole and are reduce-scattered once, after the
        step's last backward: under PP and dp_sharding=optimizer."""
        return self.layout.pp > 1 or self.dp_sharding == "optimizer"

    def fsdp_gathers_per_step(self, microbatches: int) -> int:
        """All-gathers of each of the engine's FSDP units a step: one while its weights
        stay gathered (weights_kept_gathered), else one for the forward and one for the
        backward of every microbatch (FSDP2's default)."""
        return 1 if self.weights_kept_gathered else 2 * microbatches

    def fsdp_reductions_per_step(self, microbatches: int) -> int:
        """Reduce-scatters of each of the engine's FSDP units' gradients a step: one after
        the last backward (gradients_reduced_once), else one every microbatch."""
        return 1 if self.gradients_reduced_once else microbatches

    @property
    def reduce_bytes(self) -> int:
        """Bytes per element of the gradients FSDP2 accumulates whole and reduces: the
        reduce dtype's, fp32 where the model computes in fp32."""
        return 2 if self.reduce_dtype == "bf16" and self.dtype != "fp32" else 4

    @property
    def ga(self) -> int:
        """Gradient-accumulation microbatches per step on each data-parallel rank."""
        return self.gbs // (self.mbs * self.layout.dp)

    @property
    def num_nodes(self) -> int:
        return max(1, math.ceil(self.gpus / self.gpus_per_node))

    @property
    def device(self) -> str:
        return "cpu" if self.gpu_type == hardware.CPU else "cuda"

    def to_dict(self) -> dict:
        data = asdict(self)
        data["ga"] = self.ga
        data["gpus"] = self.gpus
        data["num_nodes"] = self.num_nodes
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "Plan":
        data = {k: v for k, v in data.items() if k not in ("ga", "gpus", "num_nodes")}
        data["model"] = ModelSpec.from_dict(data["model"])
        data["layout"] = Layout(**data["layout"])
        feats = dict(data.get("features", {}))
        feats["profile_ranks"] = tuple(feats.get("profile_ranks", (0,)))
        data["features"] = Features(**feats)
        data["env"] = tuple(tuple(kv) for kv in data.get("env", ()))
        return cls(**data)


def pipeline_layers(model: ModelSpec) -> int:
    return len(model.pattern) if model.is_hybrid else model.layers


def layers_split_ok(layers: int, stages: int) -> bool:
    """NeMo's rule: layers divide evenly over the virtual stages, or do once the embedding
    and the loss each count as one layer (Llama 3.1 405B: 126 + 2 = 128 = 8 x 8 x 2)."""
    return stages <= layers + 2 and (layers % stages == 0 or (layers + 2) % stages == 0)


def compile_label(plan: Plan) -> str:
    """'on (default on GPUs)', 'off (default on CPU)', 'on (--set)', 'off (--set)': the
    state and what decided it, for --dry-run, the log header and run.json."""
    state = "on" if plan.compile else "off"
    by_device = plan.device == "cuda"
    # A plan.json from before compile_source existed says 'default' whatever decided it.
    if plan.compile_source == "set" or plan.compile != by_device:
        return f"{state} (--set)"
    return f"{state} (default on {'GPUs' if by_device else 'CPU'})"


# Measured on one H100 (README, "On a GPU"): one Llama 3.1 8B block's linears, forward and
# backward over 8192 tokens, bf16 22.21 ms eager, torchao tensorwise FP8 49.76 ms eager and
# 12.18 ms compiled (bench/fp8_linear.py).
EAGER_FP8_NOTE = ("FP8 without compiled blocks runs torchao's scaling and casts as separate "
                  "kernels: on one H100 an 8B block's linears ran 2.2x slower than bf16 eager "
                  "(1.39x faster compiled; README, \"On a GPU\"); drop --set compile=false to "
                  "measure what FP8 buys")


def performance_notes(plan: Plan) -> list[str]:
    """What a plan's settings are known to cost, said before it runs."""
    notes = []
    if plan.device == "cuda" and plan.dtype in FP8_DTYPES and not plan.compile:
        notes.append(EAGER_FP8_NOTE)
    return notes


def experiment_name(workload: str, size: str, dtype: str, gpus: int) -> str:
    return f"{workload}_{size}_{dtype}_gpus{gpus}"


def dp_sharding_label(plan: Plan) -> str:
    """'optimizer, bf16 gradients (the recipe's: ...)' and the like: the data-parallel
    sharding and gradient dtype and what chose them, for --dry-run, the log and run.json."""
    grads = "bf16" if plan.reduce_bytes == 2 else "fp32"
    sharding = "optimizer" if plan.layout.pp > 1 else plan.dp_sharding
    text = f"{sharding}, {grads} gradients"
    if plan.master_weights == "bf16":
        text += ", bf16 master weights"
    if plan.layout.pp > 1:
        text += " (a pipeline gathers the weights once a step and reduces once, whatever dp_sharding says)"
        return text if plan.dp_sharding_source != "recipe" else text[:-1] + "; the recipe's gradient dtype)"
    if plan.dp_sharding_source == "recipe":
        why = ("the closest to Megatron's distributed optimizer that fits"
               if plan.dp_sharding != "full" else
               "none of optimizer / gradients fits; the least memory")
        return f"{text} (the recipe's state sharding: {why})"
    if plan.dp_sharding_source == "set":
        return f"{text} (--set)"
    return f"{text} (default)"
