"""Step time of a plan on a GPU type, with a breakdown of where the time goes.

One microbatch on one pipeline rank costs its layers' compute (GEMMs at a shape-dependent
efficiency of the dtype's peak, flash attention and the Mamba scan at the BF16 peak,
memory-bound kernels at the HBM bandwidth) plus the exposed part of its tensor-parallel,
context-parallel and pipeline communication. A step is `m` microbatches on the slowest
rank, the pipeline bubble, the exposed data-parallel / FSDP communication and the
optimizer step. Pure Python.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .. import flops as fl
from .. import metrics
from ..plan import FP8_DTYPES, Plan
from .comm import (all_gather_s, all_reduce_s, crosses_domains, moe_dispatch_s, p2p_s,
                   reduce_scatter_s, ring_latency_s)
from .constants import Constants
from .context import DISTRIBUTED_OPTIMIZER, ENGINE, Context, MegatronRun, make_context
from .device import Device
from .fp8_cost import (TORCHAO, Fp8Recipe, float8_gathered_params, fsdp_float8_gathers,
                       layer_cast_bytes, weight_bytes)
from .memory import MemoryPrediction, memory_from_context
from .work import LayerWork, Linear

PARTS = ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_p2p", "bubble", "dp_comm",
         "optimizer")
PART_LABELS = {
    "compute": "compute",
    "tp_comm": "TP/SP collectives (exposed)",
    "cp_comm": "CP K/V exchange (exposed)",
    "ep_comm": "EP token all-to-all (exposed)",
    "pp_p2p": "PP point-to-point (exposed)",
    "bubble": "pipeline bubble",
    "dp_comm": "DP/FSDP collectives (exposed)",
    "optimizer": "optimizer step",
}
COMPUTE_PARTS = ("gemm", "attention", "scan", "memory_bound", "overhead", "recompute",
                 "overlap_slowdown", "weight_passes")

# Megatron-LM's DDP buckets gradients in groups of about 40M parameters.
DP_BUCKET_PARAMS = 40e6
# Adam step per parameter of the local shard: read and write fp32 master weight and two
# moments (24 B), read the gradient and write the bf16 weight (4 B).
OPTIMIZER_BYTES_PER_PARAM = 28.0
# engine/optim.py AdamWBf16Moments._update, per element of an fp32 weight with fp32
# gradients: each moment upcast (read 2, write 4), the first moment's lerp (read 8, write
# 4), the second's mul (4 + 4) and addcmul (read 12, write 4), both stored back to bf16
# (read 4, write 2 each), the weight decay (4 + 4), the denominator's division, square
# root and epsilon (4 + 4 each) and the update (read 12, write 4).
BF16_MOMENTS_ENGINE_BYTES_PER_PARAM = 6 + 12 + 6 + 8 + 16 + 6 + 6 + 8 + 3 * 8 + 16
# The same update of a bf16 weight kept as the only copy (plan.master_weights): its bf16
# gradient's upcast (read 2, write 4), the weight's upcast and its rounding back (6 each).
BF16_MASTER_ENGINE_EXTRA_BYTES = 3 * 6
# The engine's one-rank run without FSDP keeps fp32 weights and computes under bf16
# autocast: every microbatch casts each weight to bf16 for its forward (4 B read, 2
# written) and the weight's bf16 gradient back to fp32 (2 read, 4 written); from the
# second microbatch on, that gradient is added into the accumulated one (two fp32 reads,
# one write). Each is one pass over a whole weight, outside the layers' counted traffic.
# The embedding's lookup runs in fp32 (autocast casts no embedding): its weight is not
# cast, and each backward writes its gradient into a fresh zeroed fp32 table (4 B).
WEIGHT_DOWNCAST_BYTES_PER_PARAM = 6.0
GRAD_UPCAST_BYTES_PER_PARAM = 6.0
EMBEDDING_GRAD_ZERO_BYTES_PER_PARAM = 4.0
GRAD_ACCUMULATE_BYTES_PER_PARAM = 12.0
# Gradient clipping (torch's clip_grad_norm_, Megatron's clip_grad): the norm reads every
# fp32 gradient of the local shard (4 B), the scaling reads and writes it (4 + 4).
CLIP_BYTES_PER_PARAM = 12.0
# Under FSDP2 (torch.distributed.fsdp._fully_shard, bf16 param_dtype) each gather casts
# the fp32 shard to bf16 (read 4, write 2: FSDPParam.all_gather_inputs) and copies it
# into the all-gather buffer (read 2, write 2: foreach_all_gather's _foreach_copy_);
# after the all-gather the whole unit is copied out into its parameters (read 2, write
# 2: split_with_sizes_copy). One rank copies the cast shard straight into the unsharded
# parameters (FSDPParamGroup.wait_for_unshard): 6 + 4 B. A float8-gathered weight moves
# 1 B elements, its cast counted in fp8_cost. Each reduction copies the bf16 gradients
# into the reduce-scatter buffer in the reduce dtype (chunk_cat: read 2, write 4 for
# fp32), then a bf16-reduced shard is cast to fp32 (read 2, write 4). One rank copies
# that buffer into the output instead of reduce-scattering it (foreach_reduce,
# `reduce_output.copy_`): on the reduce-scatter stream, beside the backward, as the
# collective it stands for would be, so not charged here.
FSDP_CAST_BYTES_PER_SHARD_ELEMENT = 6.0
FSDP_COPY_BYTES_PER_ELEMENT = 4.0
# Only tensorwise scaling gathers in FP8 (fp8_cost.fsdp_float8_gathers).
TORCHAO_TENSORWISE = Fp8Recipe(TORCHAO, "tensorwise")


def gemm_efficiency(c: Constants, fp8: bool, lin: Linear) -> float:
    """Achieved fraction of peak for one GEMM: the large-matrix efficiency times a
    fall-off for the smallest dimension, d / (d + d_half) (wave quantisation and the
    memory-bound regime of thin matrices; Williams et al. 2009, the roofline model)."""
    d = min(lin.group_m or lin.m, lin.k, lin.n)
    return (c.gemm_eff_fp8 if fp8 else c.gemm_eff_bf16) * gemm_falloff(c, d)


def gemm_falloff(c: Constants, d: int) -> float:
    """The share of the large-matrix efficiency a GEMM of smallest side d reaches."""
    return d / (d + c.gemm_half_dim)


def attention_efficiency(c: Constants, seq_len: int) -> float:
    """Flash attention's fraction of the BF16 peak: rises with the sequence each kernel
    sees, L / (L + L_half) (FlashAttention-2, Dao 2023, benchmarks by sequence length)."""
    return c.attn_eff * seq_len / (seq_len + c.attn_half_len)


@dataclass(frozen=True)
class LayerTime:
    """Seconds for one layer and one microbatch on one GPU."""
    gemm: float
    attention: float
    scan: float
    memory_bound: float
    overhead: float
    recompute: float
    tp_comm: float
    """Raw time of the tensor-parallel collectives (before overlap)."""
    cp_comm: float
    ep_comm: float = 0.0
    """The MoE token all-to-alls; not overlapped (Megatron-Core's alltoall dispatcher waits
    on them unless its optional EP overlap is enabled)."""

    @property
    def compute(self) -> float:
        return (self.gemm + self.attention + self.scan + self.memory_bound + self.overhead
                + self.recompute)


def torch_scan_factor(plan: Plan, c: Constants) -> float:
    """How much longer the Mamba-2 scan takes than mamba_ssm's kernels as predict derives
    them: 1 where the plan runs the kernels (ssd_scan kernel or auto, as NVIDIA's recipes
    do), the measured torch scan's ratio where it runs that (compiled or eager)."""
    if plan.ssd_scan != "torch":
        return 1.0
    return c.torch_scan_compiled if plan.compile else c.torch_scan_eager


def layer_time(lw: LayerWork, ctx: Context) -> LayerTime:
    c, dev, plan = ctx.constants, ctx.device, ctx.plan
    bf16 = dev.peak("bf16") * 1e12
    # Roofline (Williams et al. 2009): FLOPs over the achieved rate, bytes over the achieved
    # bandwidth. GEMMs at the dtype's peak; flash attention and the Mamba-2 scan (Dao & Gu
    # 2024) stay BF16 in the FP8 recipes (Transformer Engine and torchao cast only linear
    # layers), and so does a linear the recipe keeps out of FP8 (the output head, the
    # router). The FP8 casts are memory-bound traffic (fp8_cost).
    low_precision = plan.dtype in FP8_DTYPES
    gemm = 0.0
    for lin in lw.linears:
        fp8 = lin.fp8 and low_precision
        peak = dev.peak(plan.dtype if fp8 or not low_precision else "bf16") * 1e12
        gemm += lin.flops / (peak * gemm_efficiency(c, fp8, lin))
    attention = (lw.attn_flops / (bf16 * attention_efficiency(c, lw.attn_len))
                 if lw.attn_flops else 0.0)
    # The Mamba-2 scan (Dao & Gu 2024, SSD): its matmuls at the GEMM fall-off of their
    # smallest side (the head dim) and its kernels' traffic at the memory-bound rate, both
    # from the operation's arithmetic; a measured (probe) or calibrated whole-scan rate,
    # scan_eff > 0, replaces both.
    hbm = lw.hbm_bytes + layer_cast_bytes(lw.linears, ctx)
    hbm_rate = dev.hbm_tbs * 1e12
    rate = hbm_rate * c.hbm_eff
    slower = torch_scan_factor(plan, c) if ctx.requested_sharding == ENGINE else 1.0
    if not lw.scan_flops:
        scan = 0.0
    elif c.scan_eff > 0:
        # A probe's rate is that of the scan the engine ran there: no factor on top.
        scan = lw.scan_flops / (bf16 * c.scan_eff)
    else:
        scan = lw.scan_flops / (bf16 * c.gemm_eff_bf16 * gemm_falloff(c, lw.scan_dim))
        if slower == 1.0:
            hbm += lw.scan_hbm_bytes
        else:  # the torch scan's measured time stands for its matmuls and traffic alike
            scan = (scan + lw.scan_hbm_bytes / rate) * slower
    memory_bound = (hbm / rate + lw.upcast_bytes / (hbm_rate * c.eager_upcast_eff)
                    + lw.stream_bytes / (hbm_rate * c.stream_eff))
    overhead = c.layer_overhead_us * 1e-6
    # Per sequence-parallel region: an all-gather and a reduce-scatter forward, and again
    # backward (four of each per transformer layer, Korthikanti et al. 2022). FP8 recipes
    # gather the FP8-cast input (Transformer Engine's communication overlap), half the bytes.
    in_block = lw.kind in ("attention", "mlp", "mamba")
    gather_scale = 0.5 if plan.dtype == "fp8" and in_block else 1.0
    passes = 2 if in_block else 1
    tp = passes * sum(all_gather_s(gather_scale * size, ctx.groups.tp, dev)
                      + reduce_scatter_s(size, ctx.groups.tp, dev) for size in lw.tp_gather_bytes)
    if lw.kind == "head" and plan.layout.tp > 1:
        # Vocabulary-parallel cross-entropy: all-reduces of the max, the sum and the target
        # logit per token (Megatron-LM), small and latency-bound.
        tp += 3 * all_reduce_s(4.0 * ctx.shape.tokens, ctx.groups.tp, dev)
    cp = 0.0
    if lw.cp_kv_bytes:
        steps = plan.layout.cp - 1
        crosses = crosses_domains(ctx.groups.cp, dev.nvlink_domain)
        # K/V pass around the ring in the forward; K/V and their gradients in the backward
        # (Megatron-LM context parallelism, Liu et al. 2023 "Ring Attention").
        cp = 3 * steps * p2p_s(lw.cp_kv_bytes / steps, crosses, dev)
    recompute = 0.0
    if plan.recompute == "full" and lw.kind not in ("embedding", "head"):
        # The forward runs again before the backward (Chen et al. 2016, "Training Deep Nets
        # with Sublinear Memory Cost"): a third of the FLOPs, the forward share of the
        # memory-bound work and the forward's collectives.
        recompute = (gemm + attention + scan) / 3 + 0.4 * memory_bound + overhead / 3 + tp / 2
    elif plan.recompute == "selective" and lw.kind == "attention":
        recompute = attention / 3  # core attention's forward again (Korthikanti et al. 2022)
    # Dispatch and combine, forward and backward: four all-to-alls per MoE layer.
    ep = (4 * moe_dispatch_s(lw.ep_token_bytes, plan.model.top_k, ctx.groups.ep, dev,
                             ctx.ep_dispatch) if lw.ep_token_bytes else 0.0)
    return LayerTime(gemm=gemm, attention=attention, scan=scan, memory_bound=memory_bound,
                     overhead=overhead, recompute=recompute, tp_comm=tp, cp_comm=cp,
                     ep_comm=ep)


@dataclass
class RankTime:
    """Seconds one pipeline rank spends per microbatch, by part."""
    parts: dict[str, float] = field(default_factory=dict)
    compute_parts: dict[str, float] = field(default_factory=dict)
    params: float = 0.0
    float8_params: float = 0.0
    """The share of `params` FSDP gathers in FP8 (the engine's tensorwise FP8 linears)."""
    embedding_params: float = 0.0
    """The share of `params` in the input embedding (looked up in fp32, never cast)."""
    eager_cast_params: float = 0.0
    """The share of `params` the engine casts outside its compiled blocks: the output
    head's and the routed experts' (their computation runs eager, between two graphs)."""
    units: int = 0

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def rank_time(ctx: Context, rank: int, times: dict[str, LayerTime]) -> RankTime:
    c, dev, lay = ctx.constants, ctx.device, ctx.plan.layout
    rt = RankTime(parts={k: 0.0 for k in ("compute", "tp_comm", "cp_comm", "ep_comm",
                                          "pp_p2p")},
                  compute_parts={k: 0.0 for k in COMPUTE_PARTS})
    hidden = 0.0
    for chunk in ctx.rank_counts[rank]:
        for kind, n in chunk.items():
            lt = times[kind]
            for part in ("gemm", "attention", "scan", "memory_bound", "overhead", "recompute"):
                rt.compute_parts[part] += n * getattr(lt, part)
            rt.parts["tp_comm"] += n * (1 - c.tp_overlap) * lt.tp_comm
            rt.parts["cp_comm"] += n * (1 - c.cp_overlap) * lt.cp_comm
            rt.parts["ep_comm"] += n * lt.ep_comm
            hidden += n * (c.tp_overlap * lt.tp_comm + c.cp_overlap * lt.cp_comm)
            work = ctx.work[kind]
            rt.params += n * work.params
            rt.float8_params += n * float8_gathered_params(work, ctx)
            if kind == "embedding":
                rt.embedding_params += n * work.params
            rt.eager_cast_params += n * (work.params if kind == "head" else work.expert_params)
            if kind != "mlp" or ctx.plan.model.is_hybrid:
                rt.units += n  # FSDP units: blocks, hybrid layers, embedding, head
    if lay.pp > 1:
        act = ctx.shape.tokens / lay.tp * ctx.plan.model.hidden * ctx.shape.act_bytes
        crosses = crosses_domains(ctx.groups.pp, dev.nvlink_domain)
        # Each virtual stage sends its output forward and its input gradient backward
        # (Narayanan et al. 2021; sequence-parallel activations, tokens/tp x hidden).
        p2p = 2 * len(ctx.ranks[rank]) * p2p_s(act, crosses, dev)
        rt.parts["pp_p2p"] = (1 - c.pp_overlap) * p2p
        hidden += c.pp_overlap * p2p
    # NCCL kernels take SMs and HBM bandwidth while they overlap compute (NCCL docs,
    # NCCL_MAX_CTAS / channels): hidden communication still slows compute a little.
    rt.compute_parts["overlap_slowdown"] = c.comm_slowdown * hidden
    rt.parts["compute"] = sum(rt.compute_parts.values())
    return rt


def _exposed(comm: float, window: float, pieces: int, c: Constants) -> tuple[float, float]:
    """(exposed, hidden) seconds of communication overlapped with a compute window: what
    exceeds the window shows, and the last of `pieces` buckets can never hide."""
    if comm <= 0:
        return 0.0, 0.0
    exposed = max(comm - c.dp_overlap * window, comm / max(pieces, 1))
    return exposed, comm - exposed


def data_parallel_time(ctx: Context, rt: RankTime, t_mb: float) -> tuple[float, float]:
    """(exposed, hidden) seconds per step of gradient reduction and weight gathering."""
    dev, c = ctx.device, ctx.constants
    g = ctx.groups
    wbytes = ctx.shape.act_bytes  # bf16 weights and gradients (fp32 runs: 4 B)
    if ctx.sharding == DISTRIBUTED_OPTIMIZER:
        if g.dp_cp.size == 1:
            return 0.0, 0.0
        # Megatron-LM's bucket: max(40M, 1M x data-parallel size) parameters.
        buckets = max(1, round(rt.params / max(DP_BUCKET_PARAMS, 1e6 * g.dp_cp.size)))
        extra_latency = (buckets - 1) * ring_latency_s(g.dp_cp.size, dev, c)
        rs = reduce_scatter_s(wbytes * rt.params, g.dp_cp, dev) + extra_latency
        ag = all_gather_s(wbytes * rt.params, g.dp_cp, dev) + extra_latency
        # Gradients reduce while the last microbatch runs backward; weights gather while
        # the first one runs forward (Megatron-LM overlap_grad_reduce / overlap_param_gather).
        e_rs, h_rs = _exposed(rs, 2 / 3 * t_mb, buckets, c)
        e_ag, h_ag = _exposed(ag, 1 / 3 * t_mb, buckets, c)
        return e_rs + e_ag, h_rs + h_ag
    # FSDP: every unit gathers its weights for the forward and again for the backward and
    # reduce-scatters fp32 gradients, each microbatch (FSDP2's default with accumulation).
    if g.fsdp.size == 1 and g.replicas.size == 1:
        return 0.0, 0.0
    units = max(rt.units, 1)
    extra_latency = (units - 1) * ring_latency_s(g.fsdp.size, dev, c)
    # FSDP2's float8 all-gather moves the FP8 linears' weights at 1 B (torchao fsdp_utils).
    gathered = wbytes * rt.params - (wbytes - 1) * rt.float8_params
    ag = all_gather_s(gathered, g.fsdp, dev) + extra_latency if g.fsdp.size > 1 else 0.0
    rs = (reduce_scatter_s(ctx.plan.reduce_bytes * rt.params, g.fsdp, dev) + extra_latency
          if g.fsdp.size > 1 else 0.0)
    if ctx.requested_sharding == ENGINE and ctx.plan.weights_kept_gathered:
        # The engine under PP or dp_sharding=gradients|optimizer: each unit is gathered
        # once per step; its gradients are reduce-scattered once, after the last
        # microbatch (PP, optimizer), or every microbatch (gradients; see memory.py).
        reductions = ctx.plan.fsdp_reductions_per_step(ctx.microbatches)
        e_f, h_f = _exposed(ag, 1 / 3 * t_mb, units, c)
        e_b, h_b = _exposed(rs, 2 / 3 * t_mb, units, c)
        exposed, hidden = e_f + e_b * reductions, h_f + h_b * reductions
    else:
        e_f, h_f = _exposed(ag, 1 / 3 * t_mb, units, c)
        e_b, h_b = _exposed(ag + rs, 2 / 3 * t_mb, units, c)
        exposed, hidden = (e_f + e_b) * ctx.microbatches, (h_f + h_b) * ctx.microbatches
    if g.replicas.size > 1:
        # HSDP: the shard's gradients are all-reduced across replicas once per step.
        ar = all_reduce_s(4.0 * rt.params / g.fsdp.size, g.replicas, dev)
        e, h = _exposed(ar, 2 / 3 * t_mb, units, c)
        exposed, hidden = exposed + e, hidden + h
    return exposed, hidden


def weight_pass_time(ctx: Context, rt: RankTime) -> float:
    """Seconds per step of the engine's streaming passes over whole weights and gradients
    (casts, FSDP2's copies, gradient accumulation), at the streaming rate. Nothing for a
    recipe's framework: Megatron keeps bf16 weights, gathers into them in place and fuses
    the accumulation into the weight-gradient GEMM."""
    plan = ctx.plan
    if (ctx.requested_sharding != ENGINE or ctx.sharding == DISTRIBUTED_OPTIMIZER
            or plan.dtype == "fp32"):
        return 0.0
    if plan.one_rank_without_fsdp:
        return one_rank_pass_time(ctx, rt)
    hbm, c = ctx.device.hbm_tbs * 1e12, ctx.constants
    return (fsdp_pass_bytes(ctx, rt) / (hbm * c.stream_eff)
            + fsdp_upcast_bytes(ctx, rt) / (hbm * c.eager_upcast_eff))


def one_rank_pass_time(ctx: Context, rt: RankTime) -> float:
    """Seconds per step of the one-rank autocast run's passes (the constants above). A
    gradient cast back to fp32 inside a compiled block is one fused, vectorised kernel;
    outside (the head, the routed experts, every weight when nothing is compiled) it is
    torch's eager bf16-to-fp32 copy, which reaches eager_upcast_eff of the bandwidth."""
    m, c = ctx.microbatches, ctx.constants
    cast = rt.params - rt.embedding_params
    eager = rt.eager_cast_params if ctx.plan.compile else cast
    streamed = (m * (cast * WEIGHT_DOWNCAST_BYTES_PER_PARAM
                     + (cast - eager) * GRAD_UPCAST_BYTES_PER_PARAM
                     + rt.embedding_params * EMBEDDING_GRAD_ZERO_BYTES_PER_PARAM)
                + rt.params * GRAD_ACCUMULATE_BYTES_PER_PARAM * (m - 1))
    upcast = m * eager * GRAD_UPCAST_BYTES_PER_PARAM
    hbm = ctx.device.hbm_tbs * 1e12
    return streamed / (hbm * c.stream_eff) + upcast / (hbm * c.eager_upcast_eff)


def fsdp_pass_bytes(ctx: Context, rt: RankTime) -> float:
    """Bytes per step of FSDP2's casts and copies on this rank (the constants above)."""
    plan, m, n = ctx.plan, ctx.microbatches, ctx.groups.fsdp.size
    plain, fp8 = rt.params - rt.float8_params, rt.float8_params
    copy = FSDP_COPY_BYTES_PER_ELEMENT
    if n == 1:
        per_gather = plain * (FSDP_CAST_BYTES_PER_SHARD_ELEMENT + copy) + fp8 * copy / 2
    else:
        per_gather = (plain * ((FSDP_CAST_BYTES_PER_SHARD_ELEMENT + copy) / n + copy)
                      + fp8 * (copy / 2 / n + copy / 2))
    gathers, reductions = plan.fsdp_gathers_per_step(m), plan.fsdp_reductions_per_step(m)
    per_reduction = rt.params * (2.0 + plan.reduce_bytes)
    # Gradients accumulate: unsharded in bf16 between deferred reductions (read two,
    # write one), or sharded in fp32 after each reduction from the second on.
    if plan.gradients_reduced_once:
        accumulate = rt.params * 6.0 * (m - 1)
    else:
        accumulate = rt.params / n * GRAD_ACCUMULATE_BYTES_PER_PARAM * (m - 1)
    # torchao's eager cast of each float8-gathered shard before its gather, and one amax
    # pass over it a step: fp8_cost's count, a microbatch's bytes times the microbatches.
    float8_casts = m * weight_bytes(1, fp8, TORCHAO_TENSORWISE, ctx.shape.act_bytes,
                                    microbatches=m, fsdp_float8_gathers=fsdp_float8_gathers(ctx),
                                    fsdp_shard=n) if fp8 else 0.0
    return gathers * per_gather + reductions * per_reduction + accumulate + float8_casts


def fsdp_upcast_bytes(ctx: Context, rt: RankTime) -> float:
    """Bytes per step of FSDP2 casting each bf16-reduced gradient shard to fp32 (read 2,
    write 4): torch's eager upcast, at its own rate (Constants.eager_upcast_eff)."""
    plan = ctx.plan
    if plan.reduce_bytes != 2 or bf16_master(ctx):  # bf16 shards: no upcast
        return 0.0
    reductions = plan.fsdp_reductions_per_step(ctx.microbatches)
    return reductions * rt.params * GRAD_UPCAST_BYTES_PER_PARAM / ctx.groups.fsdp.size


def optimizer_time(ctx: Context, rt: RankTime) -> float:
    """Adam over the local shard (Kingma & Ba 2015), memory-bound: a fused kernel's bytes
    at the rate a fused Adam reaches, the engine's bf16-moment AdamW's passes at the
    streaming rate (optimizer_bytes_per_param); and the gradient clipping before it."""
    lay = ctx.plan.layout
    shard = lay.dp * lay.cp if ctx.sharding == DISTRIBUTED_OPTIMIZER else ctx.groups.fsdp.size
    params = rt.params / shard
    c, hbm = ctx.constants, ctx.device.hbm_tbs * 1e12
    fused = not (ctx.plan.adam_moments == "bf16" and ctx.requested_sharding == ENGINE)
    step = optimizer_bytes_per_param(ctx) * params / (hbm * (c.fused_adam_eff if fused
                                                             else c.stream_eff))
    # Clipping's norm and scaling are multi-tensor kernels, like the fused Adam; bf16
    # master weights have bf16 gradients, half the bytes.
    clip = CLIP_BYTES_PER_PARAM * (0.5 if bf16_master(ctx) else 1.0)
    return step + clip * params / (hbm * c.fused_adam_eff)


def bf16_master(ctx: Context) -> bool:
    """The engine updates bf16 weights kept as the only copy (plan.master_weights)."""
    return ctx.plan.master_weights == "bf16" and ctx.requested_sharding == ENGINE


def optimizer_bytes_per_param(ctx: Context) -> float:
    """OPTIMIZER_BYTES_PER_PARAM for fp32 moments, in one fused kernel (torch's fused
    AdamW, the engine's on CUDA; Megatron's fused Adam). With bf16 moments each moment
    moves half the bytes in a recipe's fused kernel (Megatron's precision-aware
    optimizer); the engine's AdamWBf16Moments runs one PyTorch operation at a time
    (engine/optim.py), each a pass of its own: BF16_MOMENTS_ENGINE_BYTES_PER_PARAM."""
    if ctx.plan.adam_moments != "bf16":
        return OPTIMIZER_BYTES_PER_PARAM
    if ctx.requested_sharding == ENGINE:
        return BF16_MOMENTS_ENGINE_BYTES_PER_PARAM + (BF16_MASTER_ENGINE_EXTRA_BYTES
                                                      if bf16_master(ctx) else 0.0)
    return OPTIMIZER_BYTES_PER_PARAM - 8.0


@dataclass(frozen=True)
class StepPrediction:
    step_time_s: float
    breakdown: dict[str, float]
    """Seconds per step by part (PARTS); they add up to the step time."""
    compute_breakdown: dict[str, float]
    """Seconds per step of the compute part, by kind of work."""
    tokens_per_s: float
    tflops_per_gpu: float
    """Model TFLOPS per GPU under the published convention (the seeds' formula)."""
    mfu: float
    """Model FLOPs utilisation, published convention, as a fraction."""
    mfu_causal: float
    hardware_tflops_per_gpu: float
    """FLOPs the GPU executes (causal count, recomputation included) per second."""
    critical_rank: int
    microbatches: int
    bubble_fraction: float
    memory: MemoryPrediction
    sharding: str
    device: str
    constants: dict

    @property
    def shares(self) -> dict[str, float]:
        return {k: v / self.step_time_s for k, v in self.breakdown.items()}

    @property
    def days_per_1t_tokens(self) -> float:
        return metrics.days_to_train(self.tokens_per_s)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["memory"] = self.memory.to_dict()
        data["shares"] = self.shares
        return data


def predict_from_context(ctx: Context, memory: MemoryPrediction | None = None
                         ) -> StepPrediction:
    if ctx.device is None:
        raise LookupError(f"no device description for {ctx.plan.gpu_type}: cannot predict time")
    plan, lay = ctx.plan, ctx.plan.layout
    times = {kind: layer_time(lw, ctx) for kind, lw in ctx.work.items()}
    ranks = [rank_time(ctx, r, times) for r in range(lay.pp)]
    crit = max(range(lay.pp), key=lambda r: ranks[r].total)
    rt = ranks[crit]
    t_mb = rt.total
    m = ctx.microbatches
    # Pipeline bubble: (p-1)/m of the work for 1F1B, (p-1)/(m*v) interleaved
    # (Narayanan et al. 2021).
    bubble = (lay.pp - 1) / lay.vp * t_mb if lay.pp > 1 else 0.0
    dp_exposed, dp_hidden = data_parallel_time(ctx, rt, t_mb)
    optimizer = optimizer_time(ctx, rt)
    slowdown = ctx.constants.comm_slowdown * dp_hidden
    breakdown = {part: m * rt.parts[part]
                 for part in ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_p2p")}
    breakdown["compute"] += slowdown
    breakdown.update(bubble=bubble, dp_comm=dp_exposed, optimizer=optimizer)
    compute_parts = {k: m * v for k, v in rt.compute_parts.items()}
    compute_parts["overlap_slowdown"] += slowdown
    compute_parts["weight_passes"] = weight_pass_time(ctx, rt)
    breakdown["compute"] += compute_parts["weight_passes"]
    step = sum(breakdown.values())

    published = fl.flops_per_sequence(plan.model, plan.seq_len, "published")
    causal = fl.flops_per_sequence(plan.model, plan.seq_len, "causal")
    peak = ctx.device.peak(plan.dtype)
    recompute_factor = {"full": 4 / 3}.get(plan.recompute, 1.0)
    return StepPrediction(
        step_time_s=step, breakdown=breakdown, compute_breakdown=compute_parts,
        tokens_per_s=metrics.tokens_per_second(plan.seq_len, plan.gbs, step),
        tflops_per_gpu=metrics.tflops_per_gpu(plan.gbs, published, step, plan.gpus),
        mfu=metrics.mfu(plan.gbs, published, step, plan.gpus, peak),
        mfu_causal=metrics.mfu(plan.gbs, causal, step, plan.gpus, peak),
        hardware_tflops_per_gpu=metrics.tflops_per_gpu(plan.gbs, causal * recompute_factor,
                                                       step, plan.gpus),
        critical_rank=crit, microbatches=m,
        bubble_fraction=bubble / step, memory=memory or memory_from_context(ctx),
        sharding=ctx.sharding, device=ctx.device.key, constants=dict(vars(ctx.constants)))


def predict_step(plan: Plan, *, sharding: str = "recipe", config: dict | None = None,
                 constants: Constants | None = None, device: Device | None = None,
                 megatron: MegatronRun = MegatronRun()) -> StepPrediction:
    """Predicted step time, throughput, MFU and memory of a plan on its GPU type.

    `config`: the cluster config (calibration and bandwidth overrides); `constants` and
    `device` replace what the config and catalog give (calibration uses this).
    LookupError when the plan's device has no description (a CPU, an unknown GPU).
    """
    ctx = make_context(plan, sharding=sharding, config=config, constants=constants,
                       device=device, megatron=megatron)
    return predict_from_context(ctx)
