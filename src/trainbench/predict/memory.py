"""Memory per GPU on the most loaded pipeline rank, and a fits / does-not-fit verdict.

Model state (Rajbhandari et al. 2020, ZeRO; Megatron-LM distributed optimizer docs):
mixed-precision Adam keeps bf16 weights (2 B) and gradients (2 B) on every data-parallel
rank, and fp32 master weights and two fp32 moments (12 B) sharded over DP x CP; FSDP
shards all of it (fp32 weights, gradients, moments: 16 B) and gathers a layer's bf16
weights when it runs. Activations (Korthikanti et al. 2022, "Reducing Activation
Recomputation"): what each layer keeps for its backward with flash attention and sequence
parallelism (work.py), times the microbatches in flight on the rank; full recomputation
keeps only each layer's input. Plus the loss's logits, and an allowance for allocator
fragmentation and communication buffers. Pure Python.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..catalog.recipes import APEX_BF16_ADAM_RECIPES
from ..plan import FP8_DTYPES, Plan
from .context import DISTRIBUTED_OPTIMIZER, ENGINE, Context, make_context
from .device import GIB
from .work import block_kinds, fp8_input_bytes, logits_bytes


# Transformer Engine keeps an FP8 copy of each FP8 layer's weight across the microbatches
# of a step (1 B per parameter); the transposed copy for the backward is made when used.
# A persistent transpose too (2 B) would put the seeds' own FP8 runs (Nemotron-4 15B on 16
# GPUs, Nemotron-H 56B on 32) above 80 GB, so it is not counted.
FP8_WEIGHT_CACHE_BYTES = 1.0
# torchao (the engine) caches nothing across microbatches: it casts a gathered weight to
# FP8 for the forward and again, transposed, for the backward's input gradient, so a block
# recomputed for its backward has both casts of its FP8 weights alive beside its
# activations (2 B per parameter). `check --trace` of Llama 2 70B FP8 at DP512 (full
# recompute, one 856M-parameter block per FSDP unit) holds 1.44 GiB more temporaries at
# its peak than the BF16 trace of the same layout, 1.8 B per block parameter (README,
# "Check"); without recompute the peak is at the loss, after the casts are freed.
FP8_RECOMPUTE_CAST_BYTES = 2.0
# torch.distributed.pipelining runs an interleaved schedule through its schedule runtime,
# which unshards a rank's FSDP-wrapped virtual stages just before they compute and keeps
# at most three gathered (`_add_unshard_reshard(max_active_stages=3)`, torch >= 2.9's
# schedules.py); a plain 1F1B stage stays gathered all step.
GATHERED_VIRTUAL_STAGES = 3


@dataclass(frozen=True)
class MemoryPrediction:
    rank: int
    """Pipeline rank the figures describe (the one with the highest total)."""
    weights: float
    """Bytes: weights (bf16 on every DP rank, or the FSDP shard) and FP8 weight copies."""
    gradients: float
    optimizer: float
    """fp32 master weights and Adam moments on this rank."""
    activations: float
    in_flight: int
    """Microbatch-chunks whose activations are alive at the peak."""
    logits: float
    transient: float
    """Gathered FSDP layers, or the layer being recomputed."""
    allowance: float
    """Fragmentation and communication buffers (constants.fragmentation, buffers_gib)."""
    total: float
    capacity: float | None
    """Bytes the allocator may use on this GPU; None where the device is unknown (CPU)."""
    sharding: str
    recompute: str
    assumption: str = ""
    """How model state is sharded, in words, and whose choice that is (engine or recipe)."""

    @property
    def fits(self) -> bool | None:
        return None if self.capacity is None else self.total <= self.capacity

    @property
    def tensors(self) -> float:
        """The total without the allowance: the tensors alone, what a memory trace or a CPU
        run's allocator statistics see."""
        return self.total - self.allowance

    @property
    def total_gib(self) -> float:
        return self.total / GIB

    def to_dict(self) -> dict:
        data = asdict(self)
        data["fits"] = self.fits
        data["total_gib"] = self.total_gib
        return data

    def parts_gib(self) -> dict[str, float]:
        return {k: getattr(self, k) / GIB for k in
                ("weights", "gradients", "optimizer", "activations", "logits", "transient",
                 "allowance")}


# What a Megatron-mode memory figure leaves out, said wherever it is printed: the runs behind
# NVIDIA's current tables hold less (catalog.heldout, "Recipe facts"), and the held-out
# memory check of bench/predict_accuracy.py measures by how much.
MEGATRON_LOSS_AND_OFFLOAD = (
    "; the loss as Megatron's unfused cross entropy (10 B per logit) and no activation "
    "offload, where NVIDIA's current recipes fuse the loss in Transformer Engine (2 B per "
    "logit) and offload layers to host memory on GB200 / GB300 (--loss te and "
    "--offload-layers N charge what a run did; bench/predict_accuracy.py checks the "
    "published runs)")


def describe_sharding(ctx: Context) -> str:
    """The sharding a memory figure assumes, in one phrase a reader can check against the
    run they mean: trainbench's engine (FSDP2) or the published recipe's framework, whose
    figures also say what they leave out (MEGATRON_LOSS_AND_OFFLOAD)."""
    if ctx.requested_sharding == ENGINE:
        return _sharding_phrase(ctx)
    if ctx.megatron.default:
        return _sharding_phrase(ctx) + MEGATRON_LOSS_AND_OFFLOAD
    return _sharding_phrase(ctx) + "; " + ctx.megatron.describe()


def _sharding_phrase(ctx: Context) -> str:
    lay = ctx.plan.layout
    whose = {ENGINE: "trainbench's engine", "recipe": "the recipe"}.get(
        ctx.requested_sharding, "--sharding " + ctx.requested_sharding)
    if ctx.sharding == DISTRIBUTED_OPTIMIZER:
        n = lay.dp * lay.cp
        return (f"distributed optimizer ({whose}): optimizer state sharded over dp x cp = "
                f"{n} rank{'s' if n > 1 else ''}, weights and gradients whole on every rank")
    n, replicas = ctx.groups.fsdp.size, ctx.groups.replicas.size
    engine = ctx.requested_sharding == ENGINE
    name = "FSDP2" if engine else "FSDP"
    if engine and ctx.plan.one_rank_without_fsdp:
        text = ("one rank (trainbench's engine, no FSDP): weights, gradients and optimizer "
                "state whole")
    elif engine and ctx.plan.gpus == 1:
        text = ("one rank (trainbench's engine, FSDP2 over one rank, which FP8 keeps for its "
                "float8 all-gather): weights, gradients and optimizer state whole")
    elif n == 1:
        text = (f"{name} ({whose}) with dp x cp = 1: nothing to shard, every rank holds its "
                "weights, gradients and optimizer state whole")
    elif replicas > 1:
        text = (f"HSDP ({whose}): weights, gradients and optimizer state sharded over groups "
                f"of {n} ranks (dp_shard x cp), {replicas} replicas")
    else:
        text = (f"{name} ({whose}): weights, gradients and optimizer state sharded over "
                f"dp x cp = {n} ranks")
    grad_dtype = "bf16" if ctx.plan.reduce_bytes == 2 else "fp32"
    if engine and ctx.plan.master_weights == "bf16":
        text += "; bf16 master weights, the only copy (as Apex's bf16-state Adam keeps them)"
    if engine and lay.pp == 1 and ctx.plan.dp_sharding == "optimizer" and n > 1:
        text += (f"; dp_sharding=optimizer: weights gathered all step and {grad_dtype} "
                 "gradients whole until the step's last backward")
    elif engine and lay.pp == 1 and ctx.plan.dp_sharding == "gradients" and n > 1:
        text += ("; dp_sharding=gradients: weights gathered all step, gradients "
                 "reduce-scattered every microbatch")
    elif engine and lay.pp > 1 and lay.vp > GATHERED_VIRTUAL_STAGES:
        text += (f"; under PP a stage's {grad_dtype} gradients stay whole until the step's last "
                 f"backward, and the weights of {GATHERED_VIRTUAL_STAGES} of its {lay.vp} "
                 f"virtual stages stay gathered")
    elif engine and lay.pp > 1:
        text += (f"; under PP a stage's weights stay gathered and its {grad_dtype} gradients "
                 "whole until the step's last backward")
    return text


def in_flight_chunks(pp: int, vp: int, rank: int, microbatches: int) -> int:
    """Forward passes (of one virtual stage each) whose activations rank `rank` holds when
    its first backward starts: 1F1B holds pp - rank microbatches (Narayanan et al. 2021);
    the interleaved schedule warms up with (pp - rank - 1) * 2 + (vp - 1) * pp chunks
    (Megatron-LM's schedules.py), plus the one running."""
    if pp == 1:
        return 1
    if vp == 1:
        return min(microbatches, pp - rank)
    warmup = (pp - rank - 1) * 2 + (vp - 1) * pp
    return min(microbatches * vp, warmup + 1)


def activations_in_flight(per_chunk: list[float], pp: int, vp: int, rank: int,
                          microbatches: int) -> float:
    """The most activation bytes rank `rank` holds at once, its virtual stages keeping
    per_chunk[v] bytes a microbatch, walked through the schedule's order: the interleaved
    schedule runs rounds of pp microbatches, so forward k runs virtual stage
    (k // pp) % vp and backward k frees vp - 1 - (k // pp) % vp (Megatron-LM's
    get_model_chunk_id; torch's ScheduleInterleaved1F1B the same for a multiple of pp
    microbatches); after the warm-up's forwards each forward is followed by a backward.
    Where a rank's stages differ (DeepSeek-V3's first stage has one dense layer where
    the others have two MoE layers) the count of each stage's forwards in flight
    matters, not only their number."""
    held = peak = 0.0
    total = microbatches * vp
    warmup = min(total, in_flight_chunks(pp, vp, rank, microbatches) - 1)
    freed = 0
    for k in range(total):
        held += per_chunk[(k // pp) % vp]
        peak = max(peak, held)
        if k >= warmup:
            held -= per_chunk[vp - 1 - (freed // pp) % vp]
            freed += 1
    return peak


def stage_message_shape(plan: Plan) -> tuple[int, int, int]:
    """What one pipeline stage sends the next per microbatch: this rank's hidden states,
    the sequence cut over CP and, under sequence parallelism, over TP."""
    lay = plan.layout
    return plan.mbs, plan.seq_len // lay.cp // lay.tp, plan.model.hidden


def pipeline_buffer_bytes(ctx: Context, rank: int) -> float:
    """What torch.distributed.pipelining holds on a rank beside its layers' activations,
    with the engine's receive buffers allocated per microbatch and let go after its
    backward (engine/parallel/pp.py, _ReceivingWhenNeeded): the output of every stage
    forward in flight, which the stage keeps for its backward (a received input is its
    stage's first layer's input, counted with the layer), and two messages received
    ahead of their use (the next microbatch's hidden states and a gradient). torch's own
    PipelineStage kept a buffer per microbatch and stage, alive all step (GA of them:
    64.6 GiB per GPU on Qwen3 235B-A22B's recipe row); Megatron receives into a fresh
    tensor per microbatch, as the engine now does."""
    plan, lay = ctx.plan, ctx.plan.layout
    mbs, seq, hidden = stage_message_shape(plan)
    message = mbs * seq * hidden * (2.0 if plan.dtype != "fp32" else 4.0)
    return (in_flight_chunks(lay.pp, lay.vp, rank, ctx.microbatches) + 2) * message


def _largest_block(ctx: Context, layer_kinds, measure) -> float:
    """The largest block among `layer_kinds` by `measure` (a LayerWork -> float): a
    transformer block is its attention and its MLP (dense, or a mixture of experts: MoE
    models have both kinds), a hybrid model's block is one layer."""
    w = ctx.work
    if not ctx.plan.model.is_hybrid and "attention" in layer_kinds:
        return measure(w["attention"]) + max(measure(w[k]) for k in ("mlp", "moe") if k in w)
    return max((measure(w[k]) for k in layer_kinds), default=0.0)


def _unit_param_max(ctx: Context) -> float:
    """Largest FSDP unit: a block (_largest_block) or the embedding / head."""
    w = ctx.work
    layers = [k for k in w if k not in ("embedding", "head")]
    return max(w["embedding"].params, w["head"].params,
               _largest_block(ctx, layers, lambda lw: lw.params))


def _gathered_params(ctx: Context, chunks: list[dict[str, int]]) -> float:
    """Parameters of the virtual stages a pipeline rank holds gathered at once: all of
    them under 1F1B, the largest GATHERED_VIRTUAL_STAGES under an interleaved schedule."""
    sizes = sorted((sum(ctx.work[k].params * n for k, n in chunk.items()) for chunk in chunks),
                   reverse=True)
    return sum(sizes if ctx.plan.layout.vp == 1 else sizes[:GATHERED_VIRTUAL_STAGES])


def _fp8_params(lw) -> float:
    return sum(x.k * x.n for x in lw.linears if x.fp8)


def _kept(ctx: Context, kind: str, recompute: str) -> float:
    """Activation bytes one layer keeps for one microbatch under a recompute choice."""
    lw = ctx.work[kind]
    if kind in ("embedding", "head"):
        return lw.act_bytes
    if recompute == "full":
        # A transformer block is one checkpoint: its MLP keeps nothing of its own.
        if kind == "mlp" and not ctx.plan.model.is_hybrid:
            return 0.0
        return lw.input_bytes
    if recompute == "selective" and kind == "attention":
        if ctx.plan.model.is_mla:
            # Megatron's and the engine's: the heads and core attention rebuilt from the
            # latents; the core's output is kept by the out projection alone.
            return (lw.act_bytes - mla_up_projection_bytes(ctx) - lw.attn_out_bytes
                    + mla_output_kept_bytes(ctx))
        # Megatron's selective recompute re-runs core attention (Korthikanti et al. 2022):
        # with flash attention that drops its output and softmax statistics.
        return lw.act_bytes - lw.attn_out_bytes
    return lw.act_bytes


def mla_up_projection_bytes(ctx: Context) -> float:
    """What Megatron's `mla_up_proj` recompute frees per MLA layer and microbatch: the
    up-projected queries, keys and values (heads x (nope + rope) twice and heads x v_dim,
    this rank's heads on the whole sequence), which core attention would keep, are
    discarded after it runs and rebuilt from the latents before its backward
    (Megatron-Core's MLASelfAttention, CheckpointWithoutOutput); the latents it keeps
    instead (q's and kv's, before and after their norms, and the shared RoPE key) are
    replicated over TP. NVIDIA's DeepSeek-V3 recipes select it ("selective",
    recompute_modules ["mla_up_proj", ...]: Megatron-Bridge
    scripts/performance/configs/deepseek, deepseek_v3_pretrain_1024gpu_h100_*_config and
    the B200 / GB200 configs), where predict's plain selective recompute dropped core
    attention's output instead and kept q, k and v. The engine's selective recompute of
    MLA does the same (engine/parallel/__init__.py: MLAttention.heads kept as its
    latents), and drops core attention's output too, which the out projection keeps."""
    m, sh = ctx.plan.model, ctx.shape
    tok, t, b = sh.tokens, sh.tp, sh.act_bytes
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    up = m.heads * (2 * qk + m.v_head_dim) / t * tok * b
    latents = (2 * (m.q_lora_rank or 0) + 2 * m.kv_lora_rank + m.qk_rope_head_dim) * tok * b
    return up - latents


def mla_output_kept_bytes(ctx: Context) -> float:
    """What keeps MLA's core-attention output under its up-projection recompute, per layer
    and microbatch. The engine: its out projection keeps its input, the FP8 copy where its
    FP8 linears keep one (engine/parallel/float8_input.py; the core's output is then kept
    by nothing else), else bf16. Megatron: its recompute discards the output after the out
    projection ran and rebuilds it for the backward (CheckpointWithoutOutput); under FP8
    the out projection keeps its FP8 copy, which _attention_work already counts."""
    m, sh = ctx.plan.model, ctx.shape
    if not sh.engine:
        return 0.0
    return m.heads * m.v_head_dim / sh.tp * sh.tokens * fp8_input_bytes(sh)


def _model_state(ctx: Context, kinds: dict[str, int], chunks) -> tuple[float, ...]:
    """Bytes of (weights, gradients, optimizer state, transient model state) on a rank
    holding `kinds` layers, under the context's sharding."""
    plan, lay = ctx.plan, ctx.plan.layout
    params = sum(ctx.work[k].params * n for k, n in kinds.items())
    fp8_params = sum(n * _fp8_params(ctx.work[k]) for k, n in kinds.items())
    mixed = plan.dtype != "fp32"
    # AdamW's two moments, fp32 or bf16 (plan.adam_moments; fp32 master weights beside).
    moments = 2 * (2.0 if plan.adam_moments == "bf16" else 4.0)
    opt_shards = lay.dp * lay.cp
    # Routed experts are already split over EP, which spans a stage's tp x cp x dp ranks
    # (Megatron-Core's ETP 1 layout, and the engine's); the rest of those ranks (expert
    # data parallelism) shard them. The engine's token-local MoE parameters (router,
    # shared expert) are whole on every TP rank and sharded over the TP ranks too.
    expert = sum(ctx.work[k].expert_params * n for k, n in kinds.items())
    local = sum(ctx.work[k].token_local_params * n for k, n in kinds.items())
    dense = params - expert - local
    expert_shards = max(1, lay.dp * lay.cp * lay.tp // lay.ep)
    if ctx.sharding == DISTRIBUTED_OPTIMIZER and plan.recipe_source in APEX_BF16_ADAM_RECIPES:
        # Apex's DistributedFusedAdam with bf16 state (catalog.recipes): bf16 moments, no
        # master weights but under fp8_params (the FP8 runs), whose FP8 layers' weights
        # are their FP8 tensors alone.
        # (fp8_params, the FP8 layers' weights, is 0 in a bf16 plan.)
        weights = 2.0 * params - fp8_params
        grads = 2.0 * params
        master = 2.0 if plan.dtype == "fp8" else 0.0
        optimizer = (master + 4.0) * (dense / opt_shards + expert / expert_shards)
        transient = 0.0
    elif ctx.sharding == DISTRIBUTED_OPTIMIZER:
        weights = (2.0 if mixed else 4.0) * params
        weights += FP8_WEIGHT_CACHE_BYTES * fp8_params
        grads = (2.0 if mixed else 4.0) * params
        optimizer = ((4.0 if mixed else 0.0) + moments) * (dense / opt_shards
                                                           + expert / expert_shards)
        transient = 0.0
    else:
        shard = ctx.groups.fsdp.size
        # The engine shards an MoE layer under TP over the TP ranks too (token-local).
        moe_tp = lay.tp if ctx.requested_sharding == ENGINE and plan.model.is_moe else 1
        eshard = max(1, shard * moe_tp // lay.ep) if expert else 1
        state = dense / shard + expert / eshard + local / (shard * moe_tp)
        # fp32 master weights and their gradients, or bf16 ones kept as the only copy
        # (plan.master_weights: the Apex bf16-state recipes); Mamba-2's few fp32
        # parameters are not told apart.
        master = 2.0 if plan.master_weights == "bf16" else 4.0
        weights = master * state
        grads = master * state
        optimizer = moments * state
        unit = _unit_param_max(ctx)
        # Two gathered units alive (the running one and the prefetched one) and one unit's
        # unsharded fp32 gradients before they are reduce-scattered (FSDP2 / ZeRO-3).
        transient = (2 * (2.0 if mixed else 4.0) + 4.0) * unit if shard > 1 else 0.0
        if shard == 1:
            # The bf16 compute copy of fp32 master weights.
            weights += (2.0 if mixed and master == 4.0 else 0.0) * params
            weights += FP8_WEIGHT_CACHE_BYTES * fp8_params
        engine = ctx.requested_sharding == ENGINE
        if engine and plan.weights_kept_gathered:
            # Under PP (torch.distributed.pipelining) and under dp_sharding=gradients or
            # optimizer (the trainer's before_microbatch) the engine keeps FSDP units
            # gathered after forward and reshards them after the step's last backward:
            # the compute-dtype weights stay whole all step (three virtual stages' under
            # an interleaved schedule, _gathered_params).
            if shard > 1:
                weights += (2.0 if mixed else 4.0) * _gathered_params(ctx, chunks)
            # A unit's gradient before it is reduced or added.
            transient = (2.0 if mixed else 4.0) * unit
        if engine and plan.gradients_reduced_once:
            # Gradient reduction is deferred to the step's last backward too: they
            # accumulate unsharded in FSDP2's reduce dtype, and the sharded gradients
            # appear only when those are reduce-scattered, and are set to None after the
            # optimizer step: at the step's peak the unsharded gradients are the only ones.
            grads = float(plan.reduce_bytes) * params
    return weights, grads, optimizer, transient


def rank_memory(ctx: Context, rank: int) -> MemoryPrediction:
    plan, c = ctx.plan, ctx.constants
    lay = plan.layout
    chunks = ctx.rank_counts[rank]
    kinds = {k: 0 for chunk in chunks for k in chunk}
    for chunk in chunks:
        for k, n in chunk.items():
            kinds[k] += n
    weights, grads, optimizer, transient = _model_state(ctx, kinds, chunks)

    recompute = plan.recompute
    kept = {k: _kept(ctx, k, recompute) for k in kinds}
    per_chunk = [sum(kept[k] * n for k, n in chunk.items()) for chunk in chunks]
    in_flight = in_flight_chunks(lay.pp, lay.vp, rank, ctx.microbatches)
    activations = activations_in_flight(per_chunk, lay.pp, lay.vp, rank, ctx.microbatches)
    # Offloading keeps the first layers' activations in host memory (PP1: one microbatch in
    # flight, check_megatron_run), so the GPU holds the rest.
    activations -= sum(kept[k] for unit in block_kinds(plan.model)[:ctx.megatron.offload_layers]
                       for k in unit)
    if recompute == "full":
        layer_kinds = [k for k in kinds if k not in ("embedding", "head")]
        # The block being recomputed for its backward, and under FSDP (torchao) both FP8
        # casts of that block's weights.
        transient += _largest_block(ctx, layer_kinds, lambda lw: lw.act_bytes)
        if plan.dtype in FP8_DTYPES and ctx.sharding != DISTRIBUTED_OPTIMIZER:
            transient += FP8_RECOMPUTE_CAST_BYTES * _largest_block(ctx, layer_kinds, _fp8_params)
    logits = logits_bytes(plan.model, ctx.shape) if "head" in kinds else 0.0
    if ctx.requested_sharding == ENGINE and lay.pp > 1:
        transient += pipeline_buffer_bytes(ctx, rank)
    # PyTorch's caching allocator fragments under activations of varying lifetimes (CUDA
    # semantics docs, "memory management"); NCCL and cuBLAS keep workspaces.
    allowance = c.fragmentation * (activations + logits) + c.buffers_gib * GIB
    total = weights + grads + optimizer + activations + logits + transient + allowance
    capacity = None
    if ctx.device is not None:
        capacity = (ctx.device.capacity_gib - c.context_gib) * GIB
    return MemoryPrediction(rank=rank, weights=weights, gradients=grads, optimizer=optimizer,
                            activations=activations, in_flight=in_flight, logits=logits,
                            transient=transient, allowance=allowance, total=total,
                            capacity=capacity, sharding=ctx.sharding, recompute=recompute,
                            assumption=describe_sharding(ctx))


def memory_from_context(ctx: Context) -> MemoryPrediction:
    """The most loaded pipeline rank. In-flight activations fall rank by rank, so the peak
    is on the first two ranks (the first may hold a layer less for the embedding) or on
    the last (the logits)."""
    pp = ctx.plan.layout.pp
    ranks = sorted({0, min(1, pp - 1), pp - 1})
    return max((rank_memory(ctx, r) for r in ranks), key=lambda m: m.total)


def predict_memory(plan: Plan, *, sharding: str = "recipe", config: dict | None = None,
                   **kwargs) -> MemoryPrediction:
    """Peak memory per GPU on the most loaded pipeline rank.

    `sharding`: 'engine' (what trainbench's engine runs: FSDP2 over dp x cp), 'recipe'
    (what the plan's recipe ran under), 'distributed_optimizer' or 'fsdp'. Works without a
    device description (capacity None).
    """
    ctx = make_context(plan, sharding=sharding, config=config, need_device=False, **kwargs)
    return memory_from_context(ctx)


def tensor_bytes(plan: Plan) -> float:
    """Bytes of tensors a run of trainbench's engine allocates at its peak, without the
    fragmentation and buffer allowance: what a CPU run's allocator statistics measure."""
    return predict_memory(plan, sharding=ENGINE).tensors


def verdict(m: MemoryPrediction, gpu_type: str) -> str:
    """The peak and whether it fits, as `run` and `predict` both print it."""
    if m.capacity is None:
        return f"{m.total_gib:.1f} GiB (no memory limit known for {gpu_type})"
    cap = m.capacity / GIB
    if m.fits:
        return f"{m.total_gib:.1f} GiB of {cap:.1f} GiB usable: fits"
    parts = m.parts_gib()
    worst = max(parts, key=parts.get)
    return (f"{m.total_gib:.1f} GiB exceeds the {cap:.1f} GiB usable on {gpu_type}: "
            f"DOES NOT FIT (largest part: {worst} {parts[worst]:.1f} GiB); try more "
            "tp/pp/cp, a smaller mbs or --set recompute=full")


def check_memory(plan: Plan, *, sharding: str = ENGINE, config: dict | None = None
                 ) -> tuple[MemoryPrediction | None, str]:
    """The prediction (None where the model cannot describe the plan) and one line with
    the peak, the verdict and the sharding it assumes.

    `trainbench run` and `trainbench predict` both print this line, with trainbench's
    engine as the default sharding, so one plan has one memory figure everywhere."""
    try:
        m = predict_memory(plan, sharding=sharding, config=config)
    except (LookupError, ValueError) as err:
        return None, f"memory not checked: {err}"
    per = "rank" if plan.device == "cpu" else "GPU"
    return m, f"predicted peak memory per {per} {verdict(m, plan.gpu_type)}; assumes {m.assumption}"


def fits(plan: Plan, *, sharding: str = ENGINE, config: dict | None = None) -> tuple[bool, str]:
    """Whether the plan fits the GPU's memory, and check_memory's line. A device without
    a known memory (CPU), or a plan the model cannot describe, 'fits'."""
    m, line = check_memory(plan, sharding=sharding, config=config)
    return (m is None or m.fits is not False), line
