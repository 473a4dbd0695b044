"""Recipe tables: the parallel layout and batch sizes of every seed row. Pure data.

Each row is copied from a seed table (source named). A scale is a number of ranks:
GPUs, or processes on a CPU machine. `tiny` rows exist for scales 1, 2 and 4 and run
on any device; their global batch is the same at every scale so that losses can be
compared across layouts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

SEED_LLAMA31 = "seed 002 (NeMo 2 Llama 3.1 recipe)"
SEED_LLAMA2 = "seed 001 (MaxText Llama 2 70B recipe)"
SEED_NEMOTRON4 = "seed 003 (NeMo 2 Nemotron-4 recipe)"
SEED_NEMOTRON4_340B_OLD = "seed 000 (NeMo Launcher 24.11 Nemotron-4 340B recipe)"
SEED_NEMOTRONH = "seed 004 (NeMo 2 Nemotron-H recipe)"

APEX_BF16_ADAM_RECIPES = (SEED_NEMOTRON4_340B_OLD,)
"""Recipes whose published runs optimized with Apex's DistributedFusedAdam holding its
state in bf16, not Megatron-Core's distributed optimizer (fp32 master weights and
moments). Seed 000 runs NeMo 1.x's `megatron_gpt_pretraining.py` in the nemo:24.09
container with `nemotron4-340b-synth.yaml`, whose `optim:` is NeMo Framework Launcher's
`nemotron_340b.yaml` one (`name: distributed_fused_adam`, `dtype: bf16`, `grad_sync_dtype:
bf16`; launcher tag 24.09r, commit 35e43939), and adds `+model.fp8_params=True` to its
FP8 runs (NVIDIA/dgxc-benchmarking `nemotron/configure.sh`, tags v24.11.1 to v25.03).
NeMo's `setup_optimization` then stores no master copy of the bf16 weights (optimizer
dtype == model dtype: `store_params=False`) and a bf16 one under fp8_params
(`megatron_base_model.py`, r2.0.0rc1 to v2.1.0), and Apex keeps both moments in that
dtype (`apex/contrib/optimizers/distributed_fused_adam.py`, 2024-02 to 2024-10): 4 B a
parameter in bf16, 6 B in FP8, sharded over data parallelism, against Megatron-Core's
12 B. Under fp8_params each FP8 layer's weight is Transformer Engine's FP8 tensor itself
(NeMo builds the model under `fp8_model_init`), with no bf16 copy beside it."""
TINY = "trainbench tiny proxy"
MB_MOE_H100_2509 = ("Megatron-Bridge docs/performance-summary.md @fa0315a (25.09), DGX-H100 "
                    "table; scripts/performance/configs/deepseek/deepseek_v3_llm_pretrain.yaml "
                    "(etp 1)")
MB_MOE_H100_260401 = ("Megatron-Bridge docs/performance-summary.md @21d102f (26.04.01), "
                      "DGX-H100 rows; ETP 1 as in scripts/performance/configs/qwen3/*.yaml @fa0315a")
MB_MOE_MXFP8_260401 = ("Megatron-Bridge docs/performance-summary.md @21d102f (26.04.01), "
                       "DGX-GB200 and DGX-B200 MXFP8 rows; ETP 1")
MB_MOE_BF16_2511 = ("Megatron-Bridge docs/performance-summary.md @5776a6d (25.11), DGX-GB200 "
                    "and DGX-GB300 BF16 rows; ETP 1")

ANY_DEVICE = "any"


@dataclass(frozen=True)
class RecipeRow:
    workload: str
    size: str
    dtype: str
    gpu_type: str
    """GPU type the seed measured on ('h100'), or 'any' for tiny rows."""
    gpus: int
    seq_len: int
    layers: int
    tp: int
    pp: int
    cp: int
    ep: int
    dp: int
    vp: int
    """Virtual pipeline stages per rank; 1 where the seed says NA."""
    mbs: int
    gbs: int
    ga: int
    source: str
    dp_shard: int = 0
    """Ranks each FSDP group shards over (MaxText's FSDP=128 at 512 GPUs); 0 = all of DP."""
    note: str = ""
    recompute: str = "none"
    """Activation recomputation the published run used ('none', 'selective', 'full')."""
    pp_split: str = ""
    """Megatron's pipeline layout string where the layers do not split evenly."""
    adam_moments: str = "fp32"
    """dtype of AdamW's moments in the published run ('bf16': Megatron's precision-aware
    optimizer, master weights fp32; or Apex's bf16-state Adam, APEX_BF16_ADAM_RECIPES).
    The engine's plan for the row keeps its moments in the same dtype."""
    master_weights: str = "fp32"
    """dtype of the weights the published run's optimizer updated: 'fp32' (Megatron-Core's
    master weights), or 'bf16' where it kept no fp32 copy (APEX_BF16_ADAM_RECIPES: the bf16
    weights themselves, or under fp8_params a bf16 copy of the FP8 ones). The engine's
    plan for the row does the same (plan.master_weights)."""

    def to_dict(self) -> dict:
        return asdict(self)


def _rows(workload, size, dtypes, gpu_type, seq, layers, source, table, note="",
          recompute="none", adam_moments="fp32", master_weights="fp32"):
    """Expand a seed table: each entry is (gpus, tp, pp, cp, dp, vp, mbs, gbs, ga[, dp_shard])."""
    out = []
    for dtype in dtypes:
        for entry in table:
            gpus, tp, pp, cp, dp, vp, mbs, gbs, ga, *rest = entry
            out.append(RecipeRow(workload, size, dtype, gpu_type, gpus, seq, layers, tp, pp, cp,
                                 1, dp, vp, mbs, gbs, ga, source,
                                 dp_shard=rest[0] if rest else 0, note=note,
                                 recompute=recompute, adam_moments=adam_moments,
                                 master_weights=master_weights))
    return out


BOTH = ("bf16", "fp8")

RECIPES: list[RecipeRow] = [
    # Llama 3.1 (seed 002).
    *_rows("pretrain_llama3.1", "8b", BOTH, "h100", 8192, 32, SEED_LLAMA31, [
        (g, 1, 1, 2, g // 2, 1, 1, 16 * g, 32) for g in (8, 16, 32, 64, 128)]),
    *_rows("pretrain_llama3.1", "70b", ("bf16",), "h100", 8192, 80, SEED_LLAMA31, [
        (g, 4, 4, 2, g // 32, 5, 1, 2 * g, 64) for g in (64, 128, 256, 512, 1024, 2048)]),
    *_rows("pretrain_llama3.1", "70b", ("fp8",), "h100", 8192, 80, SEED_LLAMA31, [
        (g, 4, 8, 1, g // 32, 5, 1, 2 * g, 64) for g in (64, 128, 256, 512, 1024, 2048)]),
    *_rows("pretrain_llama3.1", "405b-proxy", BOTH, "h100", 8192, 8, SEED_LLAMA31, [
        (32, 8, 1, 2, 2, 1, 1, 64, 32)]),
    *_rows("pretrain_llama3.1", "405b-proxy", BOTH, "h100", 8192, 30, SEED_LLAMA31, [
        (64, 8, 4, 2, 1, 8, 1, 64, 64)]),
    *_rows("pretrain_llama3.1", "405b-proxy", BOTH, "h100", 8192, 62, SEED_LLAMA31, [
        (128, 8, 4, 2, 2, 8, 1, 128, 64)]),
    *_rows("pretrain_llama3.1", "405b", BOTH, "h100", 8192, 126, SEED_LLAMA31, [
        (g, 8, 8, 2, g // 128, 8, 1, g // 2, 64) for g in (512, 1024, 2048)]),
    # Llama 2 70B, MaxText: pure FSDP (+ DP beyond 256 GPUs), MBS 2, GBS = 2 x GPUs.
    *_rows("pretrain_llama2", "70b", BOTH, "h100", 4096, 80, SEED_LLAMA2, [
        (g, 1, 1, 1, g, 1, 2, 2 * g, 1, min(g, 256 if g <= 256 else 128))
        for g in (64, 128, 256, 512, 1024, 2048)],
        # MaxText's Llama 2 70B GPU configs recompute each layer but its QKV projections
        # (remat_policy=save_qkv_proj); without it the activations cannot fit in 80 GB.
        recompute="full", note="recompute: MaxText remat (the seed does not print it)"),
    # Nemotron-4 (seed 003; 340B at 128 GPUs only in the older seed 000).
    *_rows("pretrain_nemotron4", "15b", BOTH, "h100", 4096, 32, SEED_NEMOTRON4, [
        (g, 2, 1, 1, g // 2, 1, 2, 4 * g, 4) for g in (16, 32, 64, 128, 256, 512, 1024, 2048)]),
    *_rows("pretrain_nemotron4", "340b", BOTH, "h100", 4096, 96, SEED_NEMOTRON4_340B_OLD, [
        (128, 8, 8, 1, 2, 12, 1, 32, 16)],
        note="only in the older seed 000, which runs VP=12; Apex's Adam with bf16 state",
        adam_moments="bf16", master_weights="bf16"),
    *_rows("pretrain_nemotron4", "340b", BOTH, "h100", 4096, 96, SEED_NEMOTRON4, [
        (g, 8, 8, 1, g // 64, 1, 1, g // 4, 16) for g in (256, 512, 1024, 2048)],
        note="the older seed 000 runs the same layout with VP=12; the newest seed (VP NA) is kept"),
    # Nemotron-H 56B (seed 004): FP8 only.
    *_rows("pretrain_nemotronh", "56b", ("fp8",), "h100", 8192, 118, SEED_NEMOTRONH, [
        (g, 8, 1, 1, g // 8, 1, 1, 3 * g, 24) for g in (32, 64, 128, 256, 512, 1024, 2048)]),
]

# Tiny proxies: same global batch (8 sequences of 128 tokens) at every scale.
_TINY_TABLE = [(1, 1, 1, 1, 1, 1, 2, 8, 4), (2, 1, 1, 1, 2, 1, 2, 8, 2), (4, 1, 1, 1, 4, 1, 2, 8, 1)]
for _workload, _layers in (("pretrain_llama3.1", 4), ("pretrain_llama2", 4),
                           ("pretrain_nemotron4", 4), ("pretrain_nemotronh", 6)):
    RECIPES += _rows(_workload, "tiny", ("bf16", "fp32", "fp8"), ANY_DEVICE, 128, _layers, TINY,
                     _TINY_TABLE)
# The MoE tiny proxies: their fp8 row serves --dtype mxfp8 (torchao's MXFP8 grouped GEMM,
# emulated on a CPU); plan validation refuses plain fp8 for MoE (no CPU grouped GEMM).
for _workload in ("pretrain_qwen3", "pretrain_deepseek_v3"):
    RECIPES += _rows(_workload, "tiny", ("bf16", "fp32", "fp8"), ANY_DEVICE, 128, 4, TINY,
                     _TINY_TABLE)


def _moe_row(workload, size, dtype, gpu_type, gpus, layers, tp, pp, vp, ep, mbs, gbs, source,
             note="", pp_split=""):
    """A published MoE layout (seq 4096, CP 1, ETP 1: the expert weights are not TP-split;
    EP spans the TP x DP ranks of a pipeline stage, as in Megatron-Core)."""
    dp = gpus // (tp * pp)
    # Megatron-Bridge's DeepSeek-V3 recipe runs the precision-aware optimizer with bf16
    # moments (recipes/deepseek/deepseek_v3.py @05d003f: use_precision_aware_optimizer,
    # exp_avg_dtype = exp_avg_sq_dtype = bf16, main_params_dtype fp32).
    moments = "bf16" if workload == "pretrain_deepseek_v3" else "fp32"
    return RecipeRow(workload, size, dtype, gpu_type, gpus, 4096, layers, tp, pp, 1, ep, dp,
                     vp, mbs, gbs, gbs // (mbs * dp), source,
                     note=("ETP 1" + ("; " + note if note else "")), recompute="selective",
                     pp_split=pp_split, adam_moments=moments)


# 61 layers do not split evenly over the stages: Megatron-Core places them with an uneven
# pipeline layout (pp_split.py). PP8 x VP4: "Et|(tt|)*30mL", the embedding and one layer,
# 30 stages of two, then MTP and the loss (deepseek_v3_llm_pretrain.yaml @fa0315a).
# PP4 x VP4: "Et*4|(tttt|)*14tL", the embedding and 4 layers, 14 stages of 4, the last layer
# and the loss: the layout Megatron-Bridge's DeepSeek-V3 recipe picks for 16 stages
# (recipes/deepseek/deepseek_v3.py, _get_deepseek_v3_pipeline_layout, its last stage
# without the MTP layer for the rows published without MTP). PP2 x VP4 (8 stages, the
# GB300 BF16 row of 25.11): the row names no layout and that map has no (2, 4) entry; it
# gives its two 8-stage entries, (8, 1) and (4, 2), one layout, "Et*8|(t*8|)*6t*5L", the
# embedding and 8 layers, 6 stages of 8, 5 layers and the loss, which the row takes,
# said as assumed in its note.
_DSV3_LAYOUT = "uneven pipeline layout (Megatron pipeline_model_parallel_layout)"
DSV3_SPLIT_32 = "Et|(tt|)*30mL"
DSV3_SPLIT_16 = "Et*4|(tttt|)*14tL"
DSV3_SPLIT_8 = "Et*8|(t*8|)*6t*5L"
DSV3_SPLITS = {32: DSV3_SPLIT_32, 16: DSV3_SPLIT_16, 8: DSV3_SPLIT_8}
"""The layouts above by PP x VP stage count (Megatron-Bridge's map gives every (pp, vp)
of 16 stages the same layout), for predicting published rows."""

# The real MoE sizes: NVIDIA's published layouts (catalog.heldout holds their step times).
# H100 published FP8 only; BF16 layouts were published for GB200/GB300 only. Recompute:
# the recipes' "selective" (deepseek_v3_llm_pretrain.yaml @fa0315a).
RECIPES += [
    _moe_row("pretrain_deepseek_v3", "671b", "fp8", "h100", 1024, 61, 2, 8, 4, 64, 1, 8192,
             MB_MOE_H100_2509, "no later H100 row published; " + _DSV3_LAYOUT,
             pp_split=DSV3_SPLIT_32),
    _moe_row("pretrain_qwen3", "30b_a3b", "fp8", "h100", 16, 48, 1, 1, 1, 16, 1, 1024,
             MB_MOE_H100_260401),
    _moe_row("pretrain_qwen3", "235b_a22b", "fp8", "h100", 256, 94, 2, 8, 4, 32, 1, 8192,
             MB_MOE_H100_260401),
    _moe_row("pretrain_deepseek_v3", "671b", "bf16", "gb300", 256, 61, 1, 2, 4, 32, 1, 4096,
             MB_MOE_BF16_2511, "without MTP; " + _DSV3_LAYOUT + " not published, assumed: "
             "Megatron-Bridge's 8-stage one (recipes/deepseek/deepseek_v3.py, its (8, 1) and "
             "(4, 2) entries)",
             pp_split=DSV3_SPLIT_8),
    _moe_row("pretrain_deepseek_v3", "671b", "bf16", "gb200", 256, 61, 1, 4, 4, 64, 1, 4096,
             MB_MOE_BF16_2511, "without MTP; " + _DSV3_LAYOUT, pp_split=DSV3_SPLIT_16),
    _moe_row("pretrain_qwen3", "235b_a22b", "bf16", "gb300", 256, 94, 1, 4, 12, 16, 2, 8192,
             MB_MOE_BF16_2511),
    _moe_row("pretrain_qwen3", "235b_a22b", "bf16", "gb200", 256, 94, 1, 8, 3, 32, 1, 8192,
             MB_MOE_BF16_2511),
    # MXFP8 (Blackwell): --dtype mxfp8 takes these where they exist, else the fp8 rows.
    _moe_row("pretrain_deepseek_v3", "671b", "mxfp8", "gb200", 256, 61, 1, 4, 4, 64, 1, 4096,
             MB_MOE_MXFP8_260401, _DSV3_LAYOUT, pp_split=DSV3_SPLIT_16),
    _moe_row("pretrain_deepseek_v3", "671b", "mxfp8", "b200", 256, 61, 1, 8, 2, 32, 1, 4096,
             MB_MOE_MXFP8_260401, _DSV3_LAYOUT, pp_split=DSV3_SPLIT_16),
    _moe_row("pretrain_qwen3", "30b_a3b", "mxfp8", "gb200", 8, 48, 1, 1, 1, 8, 4, 512,
             MB_MOE_MXFP8_260401),
    _moe_row("pretrain_qwen3", "30b_a3b", "mxfp8", "b200", 8, 48, 1, 1, 1, 8, 4, 512,
             MB_MOE_MXFP8_260401),
    _moe_row("pretrain_qwen3", "235b_a22b", "mxfp8", "gb200", 256, 94, 1, 8, 3, 32, 1, 8192,
             MB_MOE_MXFP8_260401),
]


def rows_for(workload: str, size: str | None = None, dtype: str | None = None,
             gpu_type: str | None = None) -> list[RecipeRow]:
    """Rows matching every filter given; a gpu_type matches its own rows and 'any' rows."""
    return [
        r for r in RECIPES
        if r.workload == workload
        and (size is None or r.size == size)
        and (dtype is None or r.dtype == dtype)
        and (gpu_type is None or r.gpu_type in (gpu_type, ANY_DEVICE))
    ]


def dtypes_for(workload: str, size: str) -> list[str]:
    return sorted({r.dtype for r in rows_for(workload, size)})


def scales_for(workload: str, size: str, dtype: str, gpu_type: str | None = None) -> list[int]:
    return sorted({r.gpus for r in rows_for(workload, size, dtype, gpu_type)})


def find_row(workload: str, size: str, dtype: str, gpus: int, gpu_type: str) -> RecipeRow:
    """The row for this workload/size/dtype/scale on this GPU type.

    GPU types the seeds did not measure use the H100 row, and say so in the row's note:
    the layout is a starting point there, not a published recipe.
    """
    candidates = rows_for(workload, size, dtype)
    if not rows_for(workload, size):
        raise LookupError(
            f"no recipe for {workload} {size} (no published layout in the catalog); use --set "
            "tp=1 pp=1 cp=1 dp=N mbs=M gbs=G to give a layout")
    if not candidates:
        raise LookupError(
            f"{workload} {size} has no {dtype} recipe; dtypes: {', '.join(dtypes_for(workload, size))}")
    own = [r for r in candidates if r.gpu_type in (gpu_type, ANY_DEVICE)]
    borrowed = not own
    pool = own or [r for r in candidates if r.gpu_type == "h100"]
    if not pool:
        # The MoE sizes' BF16 layouts were published for GB200/GB300 only.
        where = ", ".join(sorted({f"{r.gpu_type} x{r.gpus}" for r in candidates}))
        raise LookupError(
            f"{workload} {size} has no {dtype} recipe for {gpu_type} (published: {where}); "
            "use --gpu with one of those, another --dtype, or give the layout with --set "
            "tp=.. pp=.. cp=.. ep=.. dp=.. vp=..")
    for row in pool:
        if row.gpus == gpus:
            if borrowed:
                return replace(row, note=(row.note + "; " if row.note else "")
                               + f"no {gpu_type} recipe in the seeds: H100 layout used")
            return row
    scales = ", ".join(str(s) for s in sorted({r.gpus for r in pool}))
    raise LookupError(f"{workload} {size} {dtype} has no recipe row for scale {gpus}; "
                      f"scales: {scales} (or override the layout with --set)")
