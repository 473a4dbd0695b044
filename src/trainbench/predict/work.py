"""The work one GPU does for one layer and one microbatch: GEMM shapes, non-GEMM FLOPs,
memory-bound traffic, saved activations and parameters, under tensor, sequence and
context parallelism.

FLOP totals come from trainbench.flops (the causal convention: what the hardware runs);
this module splits each layer into its linear layers (GEMMs, which run in FP8 in the FP8
recipes) and the rest (flash attention, the Mamba-2 scan), then divides by the parallel
degrees. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import flops as fl
from ..catalog.hybrid import LAYER_KINDS
from ..catalog.models import ModelSpec
from ..pp_split import layer_counts
from .moe_cost import padded_rows, permutation_bytes, router_bytes

KINDS = ("attention", "mlp", "moe", "mamba", "embedding", "head")


@dataclass(frozen=True)
class Linear:
    """One linear layer as a GEMM of the forward pass on one GPU: (m x k) @ (k x n)."""
    name: str
    m: int
    k: int
    n: int
    fp8: bool
    """Runs in FP8 in an FP8 recipe (Transformer Engine layers; not the output head)."""
    group_m: int = 0
    """Rows of each GEMM when this is a grouped GEMM (m rows over several experts), which
    decide its efficiency; 0 = one GEMM of m rows."""

    @property
    def flops(self) -> float:
        # Forward, input gradient and weight gradient: three GEMMs of 2*m*k*n FLOPs
        # (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training", sec. 5.1).
        return 6.0 * self.m * self.k * self.n


@dataclass(frozen=True)
class LayerWork:
    """Work of one layer for one microbatch on one GPU, forward + backward."""
    kind: str
    linears: tuple[Linear, ...]
    attn_flops: float = 0.0
    """Flash-attention FLOPs (causal), forward + backward."""
    attn_len: int = 0
    """Sequence length each attention kernel sees (s / cp)."""
    scan_flops: float = 0.0
    """Mamba-2 SSD scan and causal convolution FLOPs, forward + backward."""
    scan_dim: int = 0
    """Smallest side of the SSD scan's matmuls (the head dim): their GEMM fall-off."""
    scan_hbm_bytes: float = 0.0
    """HBM traffic of the SSD scan's kernels, forward + backward (ssd_scan_bytes); charged
    apart from hbm_bytes so that a measured scan rate (probe) can replace both."""
    hbm_bytes: float = 0.0
    """Traffic of memory-bound kernels (norms, activation functions, residual adds, RoPE),
    forward + backward; FP8 casts are charged from `linears` (predict.fp8_cost)."""
    upcast_bytes: float = 0.0
    """Traffic of eager bf16-to-fp32 copies (the engine's loss upcasting its logits),
    forward + backward: charged at their own measured rate (Constants.eager_upcast_eff)."""
    stream_bytes: float = 0.0
    """Traffic of whole-tensor streaming passes (fills, casts down to bf16, concatenations)
    forward + backward, at the streaming rate (Constants.stream_eff)."""
    act_bytes: float = 0.0
    """Activations kept from the forward for the backward (no recomputation)."""
    input_bytes: float = 0.0
    """The layer's input: all full recomputation keeps."""
    attn_out_bytes: float = 0.0
    """Flash attention's output and softmax statistics: what selective recompute drops."""
    params: float = 0.0
    """Parameters held on this GPU (after tensor parallelism)."""
    tp_gather_bytes: tuple[float, ...] = field(default=())
    """Gathered sizes of the sequence-parallel regions: a layer all-gathers its input and
    reduce-scatters its output in the forward and again in the backward; the embedding
    reduce-scatters forward and gathers backward, the head the reverse."""
    cp_kv_bytes: float = 0.0
    """K and V this GPU sends around the context-parallel ring in one forward pass."""
    ep_token_bytes: float = 0.0
    """One hidden-wide copy of the tokens this GPU routes in an MoE layer; four token
    dispatches per microbatch (dispatch and combine, forward and backward) each move
    what comm.moe_dispatch_s charges for it."""
    expert_params: float = 0.0
    """The routed experts' share of `params` (this GPU's E/ep experts): their gradients and
    optimizer state are sharded over the expert-data-parallel ranks only."""
    token_local_params: float = 0.0
    """The share of `params` that the engine keeps whole on every TP rank of an MoE layer
    (router and shared expert: each TP rank runs its own tokens through them,
    engine/parallel/tp.py MoETokenLocal) and FSDP shards over the TP ranks too."""

    @property
    def gemm_flops(self) -> float:
        return sum(lin.flops for lin in self.linears)


@dataclass(frozen=True)
class Shape:
    """Parallel degrees and sizes that decide per-GPU work."""
    mbs: int
    seq_len: int
    tp: int
    cp: int
    act_bytes: int
    """Bytes per activation element: 2 for bf16/fp8 recipes, 4 for fp32."""
    fp8: bool
    ep: int = 1
    engine: bool = False
    """trainbench's engine rather than the recipe's Megatron-LM, where they differ: the
    output head keeps its all-gathered, whole-sequence input under sequence parallelism
    (every other column-parallel linear keeps the shard and gathers it again, as
    Megatron does); an MoE layer's shared expert runs whole on each TP rank's tokens/tp
    (Megatron splits it over TP on the gathered sequence); the all-gather CP keeps its
    chunks' outputs beside their concatenation; an FP8 linear keeps its bf16 input unless
    `fp8_input_kept`; and the loss is cut into chunks (logits_bytes)."""
    fp8_input_kept: bool = False
    """The engine's FP8 linears keep their input's FP8 cast (1 B) for the backward where
    that frees the bf16 input: the tensorwise recipe, run eagerly
    (engine/parallel/float8_input.py; torchao's own float8 linear, which the rowwise
    recipe runs, keeps the bf16 input). A compiled block (the default on GPUs) keeps what
    AOTAutograd's partitioner chooses, not yet measured on a GPU: predict charges the bf16
    input there."""
    fused_loss: bool = False
    """A Megatron-LM run's loss is Transformer Engine's fused cross entropy (its
    `cross_entropy_fusion_impl = "te"`, in NVIDIA's recipes from Megatron-Bridge 25.09 and
    NeMo 25.07 on; catalog.heldout, "the loss") rather than Megatron's unfused
    vocabulary-parallel one: fewer bytes kept (logits_bytes) and moved (the head's
    traffic). Not the engine's."""

    @property
    def tokens(self) -> int:
        """Tokens of one microbatch on one GPU of a context-parallel group."""
        return self.mbs * self.seq_len // self.cp


def attention_linears(m: ModelSpec, sh: Shape) -> tuple[Linear, ...]:
    if m.kv_lora_rank:
        # Multi-head latent attention (DeepSeek-V3 sec. 2.1.1): q down to q_lora_rank and
        # up to heads x (nope + rope); kv down to kv_lora_rank plus the shared rope key, up
        # to heads x (nope + v); output from heads x v. Down projections are replicated
        # across TP (Megatron-Core), up and output projections split.
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q_in = m.q_lora_rank or m.hidden
        lins = [Linear("q_down", sh.tokens, m.hidden, m.q_lora_rank, sh.fp8)] if m.q_lora_rank else []
        return (*lins,
                Linear("q_up", sh.tokens, q_in, m.heads * qk // sh.tp, sh.fp8),
                Linear("kv_down", sh.tokens, m.hidden, m.kv_lora_rank + m.qk_rope_head_dim,
                       sh.fp8),
                Linear("kv_up", sh.tokens, m.kv_lora_rank,
                       m.heads * (m.qk_nope_head_dim + m.v_head_dim) // sh.tp, sh.fp8),
                Linear("out", sh.tokens, m.heads * m.v_head_dim // sh.tp, m.hidden, sh.fp8))
    q_out, kv_out = m.heads * m.head_dim, m.kv_heads * m.head_dim
    # Column-parallel QKV, row-parallel output projection (Megatron-LM, Shoeybi et al. 2019).
    return (Linear("qkv", sh.tokens, m.hidden, (q_out + 2 * kv_out) // sh.tp, sh.fp8),
            Linear("out", sh.tokens, q_out // sh.tp, m.hidden, sh.fp8))


def mlp_linears(m: ModelSpec, sh: Shape) -> tuple[Linear, ...]:
    up = 2 * m.ffn if m.mlp == "swiglu" else m.ffn  # gate and up fused for SwiGLU
    return (Linear("up", sh.tokens, m.hidden, up // sh.tp, sh.fp8),
            Linear("down", sh.tokens, m.ffn // sh.tp, m.hidden, sh.fp8))


def mamba_linears(m: ModelSpec, sh: Shape) -> tuple[Linear, ...]:
    d_inner, gn = m.mamba_d_inner, m.mamba_groups * m.mamba_state
    in_out = 2 * d_inner + 2 * gn + m.mamba_heads  # z, x, B, C, dt
    return (Linear("in_proj", sh.tokens, m.hidden, in_out // sh.tp, sh.fp8),
            Linear("out_proj", sh.tokens, d_inner // sh.tp, m.hidden, sh.fp8))


@dataclass(frozen=True)
class _Common:
    """What every layer kind's work shares at a shape (see layer_work)."""
    t: int
    tok: float
    b: float
    h: int
    norm_residual: float
    gb: float
    norm_saved: float
    head_gathered: float
    input_bytes: float
    gather: float


def fp8_input_bytes(sh: Shape) -> int:
    """Bytes an element of an FP8 linear's input kept for the backward: the FP8 copy (1)
    where the recipe keeps it (_common), else the activation dtype's."""
    return 1 if sh.fp8 and (not sh.engine or sh.fp8_input_kept) else sh.act_bytes


def _common(m: ModelSpec, sh: Shape) -> _Common:
    t, tok, b = sh.tp, sh.tokens, sh.act_bytes
    h = m.hidden
    # Sequence parallelism keeps norms and residuals on tokens/tp (Korthikanti et al. 2022);
    # per token, a norm reads x and writes y forward and reads x, dy and writes dx backward
    # (5 h), a residual add reads two and writes one forward and passes the gradient on (4 h).
    norm_residual = 9.0 * h * tok / t
    # FP8 recipes keep a GEMM's input in FP8 (1 B): Transformer Engine saves the cast copy,
    # and so does the engine under tensorwise scaling (fp8_input_kept). torchao's own
    # float8 linear (the engine's rowwise recipe) keeps the high-precision input and
    # casts it again in the backward (matmul_with_hp_or_float8_args saves input_hp).
    gb = fp8_input_bytes(sh)
    # Layer input and norm output, kept on tokens/tp: Megatron gathers the norm output again
    # for the weight gradient (four all-gathers and reduce-scatters per transformer layer),
    # and so does the engine (engine/parallel/tp.py, GatherSequence), which keeps the
    # bf16 shard for it: its FP8 linears keep the norm output in FP8 only at TP1.
    norm_gb = b if sh.engine and t > 1 else gb
    norm_saved = h * (tok / t * b + tok / t * norm_gb)
    # The output head's column-parallel linear gathers its own input and keeps it whole
    # in the engine (DTensor's ColwiseParallel).
    head_gathered = tok if sh.engine else tok / t
    input_bytes = h * tok / t * b
    gather = float(tok * h * b)  # one sequence-parallel all-gather of the layer input
    return _Common(t, tok, b, h, norm_residual, gb, norm_saved, head_gathered, input_bytes,
                   gather)


def _attention_work(m: ModelSpec, sh: Shape, c: _Common) -> LayerWork:
    t, tok, b, h = c.t, c.tok, c.b, c.h
    lins = attention_linears(m, sh)
    per_seq = (fl.mla_layer_flops(m, sh.seq_len) if m.is_mla
               else fl.attention_layer_flops_causal(m, sh.seq_len))
    total = per_seq * sh.mbs / (sh.cp * t)
    gemm = sum(x.flops for x in lins)
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    rope = 4.0 * (q + kv) * tok / t if m.position_embedding == "rope" else 0.0
    hbm = (c.norm_residual + rope) * b
    # Flash attention keeps q, k, v, its output and the softmax log-sum-exp (fp32). MLA's
    # keys are as wide as its queries (nope + rope), its values and output v_head_dim.
    qkv, out = q + 2 * kv, q
    if m.is_mla:
        qkv = m.heads * (2 * (m.qk_nope_head_dim + m.qk_rope_head_dim) + m.v_head_dim)
        out = m.heads * m.v_head_dim
    attn_out = (out * tok / t) * b + m.heads / t * tok * 4
    if sh.engine and sh.cp > 1:
        # The engine's all-gather CP keeps the chunks' outputs beside their
        # concatenation, the out projection's input; like Megatron's ring it keeps
        # only its own shard of K and V and gathers the whole sequence's again in
        # the backward (parallel/cp.py). Selective recompute drops both with the core.
        # The concatenation is the out-projection's input alone: FP8 under gb.
        attn_out += q * tok / t * c.gb
    act = c.norm_saved + qkv * tok / t * b + attn_out
    if sh.fp8 and not sh.engine:
        act += out * tok / t  # the FP8 copy of the output, the out-projection's input
    params = h * (q + 2 * kv) / t + q * h / t + (2 * h if m.norm == "layernorm1p" else h)
    if m.is_mla:
        # MLA's own projections (replicated down, TP-split up and out) and its three
        # norms: the layer's, q's latent and kv's latent.
        params = sum(x.k * x.n for x in lins) + h + m.q_lora_rank + m.kv_lora_rank
    # Ring attention: each rank passes its K and V to the next, cp-1 times (Liu et al.
    # 2023, "Ring Attention"; Megatron-LM context parallelism).
    cp_kv = 2.0 * kv * tok / t * b * (sh.cp - 1)
    return LayerWork("attention", lins, attn_flops=total - gemm, attn_len=sh.seq_len // sh.cp,
                     hbm_bytes=hbm, act_bytes=act, input_bytes=c.input_bytes,
                     attn_out_bytes=attn_out, params=params,
                     tp_gather_bytes=(c.gather,) if t > 1 else (),
                     cp_kv_bytes=cp_kv if sh.cp > 1 else 0.0)


def _mlp_work(m: ModelSpec, sh: Shape, c: _Common) -> LayerWork:
    t, tok, b, h = c.t, c.tok, c.b, c.h
    lins = mlp_linears(m, sh)
    f = m.ffn / t
    # SwiGLU reads gate and up and writes the product forward (3 f), and reads both and
    # the gradient and writes two gradients backward (5 f); squared ReLU: 2 f and 3 f.
    act_fn = (8.0 if m.mlp == "swiglu" else 5.0) * f * tok
    hbm = (c.norm_residual + act_fn) * b
    # Kept: gate and up (SwiGLU) or the pre-activation (squared ReLU), and the
    # activation's output, the down projection's input.
    kept = ((2.0 if m.mlp == "swiglu" else 1.0) * b + c.gb) * f * tok
    params = sum(x.k * x.n for x in lins) + (2 * h if m.norm == "layernorm1p" else h)
    return LayerWork("mlp", lins, hbm_bytes=hbm, act_bytes=c.norm_saved + kept,
                     input_bytes=c.input_bytes, params=params,
                     tp_gather_bytes=(c.gather,) if t > 1 else ())


def _moe_work(m: ModelSpec, sh: Shape, c: _Common) -> LayerWork:
    t, tok, b, h = c.t, c.tok, c.b, c.h
    # Sequence parallelism hands the MoE layer tokens/tp per rank (Megatron-Core's, and
    # the engine's token-local layer); with ETP 1 (the published recipes, and
    # trainbench's engine) experts are whole on each rank and the routed rows go to the
    # EP rank holding their expert: under balanced routing each rank computes its
    # tokens x top_k rows over its E/ep local experts. The shared expert: Megatron
    # splits it over TP on the gathered sequence, the engine runs it whole on the
    # rank's tokens (the same FLOPs, rows and activations).
    f, E, ep = m.moe_ffn, m.n_routed_experts, max(sh.ep, 1)
    mine = tok / t
    rows = mine * m.top_k
    # Each local expert's GEMM runs its rows, padded to 16 in FP8 (moe_cost).
    per_expert = padded_rows(rows * ep / E, sh.fp8)
    run_rows = per_expert * (E // ep) if sh.fp8 else int(rows)
    lins = [Linear("router", int(mine), h, E, False),
            Linear("experts_up", run_rows, h, 2 * f, sh.fp8, group_m=per_expert),
            Linear("experts_down", run_rows, f, h, sh.fp8, group_m=per_expert)]
    fs = f * m.n_shared_experts
    shared_split = 1 if sh.engine else t
    if m.n_shared_experts:
        shared_tok = int(mine) if sh.engine else tok
        lins += [Linear("shared_up", shared_tok, h, 2 * fs // shared_split, sh.fp8),
                 Linear("shared_down", shared_tok, fs // shared_split, h, sh.fp8)]
    # SwiGLU's traffic as in 'mlp' (routed and shared rows; the shared expert's rows
    # count tokens/tp at its whole width), the router's softmax and top-k, and the
    # permutation of the routed rows to their experts and back (moe_cost).
    shared_rows = tok / t * m.n_shared_experts
    hbm = ((c.norm_residual + 8.0 * f * (rows + shared_rows)) * b + router_bytes(mine, E)
           + permutation_bytes(mine, rows, h, b, E // ep, ep,
                               fused_dispatch=not sh.engine))
    # The down projection's input: the engine's routed experts (torchao's rowwise grouped
    # GEMM) keep it in bf16, its shared expert's FP8 down projection as gb says.
    routed_gb = b if sh.engine else c.gb
    # No expert output is kept: the gate weights scale the experts' activation, before
    # the down projection, in the engine (MoE.activate, counted by tests/test_moe_saved.py)
    # and in Megatron-Core (TEGroupedMLP applies the permuted probs in
    # weighted_bias_swiglu_impl; its dispatcher unpermutes without them), so the combine
    # is a plain sum that keeps only indices. Kept per routed row: the GEMMs' input, gate
    # and up, the down projection's input.
    kept = (((2.0 * b + routed_gb) * f + h * b) * rows
            + ((2.0 * b + c.gb) * f + h * b) * shared_rows + E * mine * 4)
    # The norm's input and output stay on the rank's tokens: nothing gathers them. The
    # engine's bf16 router keeps the norm output in bf16 whatever its FP8 linears keep.
    moe_norm_saved = h * tok / t * (b + (b if sh.engine else c.gb))
    local = h * E + 3 * h * fs if sh.engine and t > 1 else 0.0
    params = (h * E + (E // ep) * 3 * h * f + 3 * h * fs / shared_split + h)
    return LayerWork("moe", tuple(lins), hbm_bytes=hbm, act_bytes=moe_norm_saved + kept,
                     input_bytes=c.input_bytes, params=params,
                     ep_token_bytes=mine * h * b if ep > 1 else 0.0,
                     expert_params=(E // ep) * 3 * h * f, token_local_params=local)


def _mamba_work(m: ModelSpec, sh: Shape, c: _Common) -> LayerWork:
    t, tok, b, h = c.t, c.tok, c.b, c.h
    lins = mamba_linears(m, sh)
    d_inner, gn, H = m.mamba_d_inner / t, m.mamba_groups * m.mamba_state / t, m.mamba_heads / t
    total = fl.mamba_layer_flops(m, sh.seq_len) * sh.mbs / (sh.cp * t)
    gemm = sum(x.flops for x in lins)
    conv_ch = d_inner + 2 * gn
    # Causal conv + SiLU over x, B, C (read, write forward; 3x backward) and the
    # RMSNorm over d_inner (y in, out forward; y, dout in, dy out backward: 5 d_inner;
    # the gate z is applied inside the scan, ssd_scan_bytes).
    hbm = (c.norm_residual + 8.0 * conv_ch * tok + 5.0 * d_inner * tok) * b
    # Kept: in_proj output (z, xBC, dt) and the scan output y; the memory-efficient path
    # (mamba_split_conv1d_scan_combined, which Megatron-LM trains with) recomputes the
    # convolution and the gated norm in the backward. Plus fp32 dt and dA per head. The
    # engine reruns the mixer from in_proj's output and its out_proj keeps its own
    # input, the gated norm's output: FP8 under gb.
    y_bytes = c.gb if sh.engine else b
    kept = ((2 * d_inner + 2 * gn + H) * b + d_inner * y_bytes) * tok + 2 * H * tok * 4
    params = (sum(x.k * x.n for x in lins) + conv_ch * (m.mamba_conv_kernel + 1)
              + 3 * H + d_inner + h)
    return LayerWork("mamba", lins, scan_flops=total - gemm, scan_dim=m.mamba_head_dim,
                     scan_hbm_bytes=ssd_scan_bytes(m, sh) * tok, hbm_bytes=hbm,
                     act_bytes=c.norm_saved + kept, input_bytes=c.input_bytes, params=params,
                     tp_gather_bytes=(c.gather,) if t > 1 else ())


def _embedding_work(m: ModelSpec, sh: Shape, c: _Common) -> LayerWork:
    t, tok, b, h = c.t, c.tok, c.b, c.h
    # A vocabulary-parallel lookup (Shoeybi et al. 2019): no FLOPs; the output is
    # reduce-scattered to the sequence-parallel layout; backward scatters gradients into
    # the table (fp32): read and write h per token each way.
    params = m.vocab_size * h / t
    return LayerWork("embedding", (), hbm_bytes=(2.0 * b + 2.0 * 4) * h * tok, params=params,
                     act_bytes=0.0, tp_gather_bytes=(c.gather,) if t > 1 else ())


def _head_work(m: ModelSpec, sh: Shape, c: _Common) -> LayerWork:
    t, tok, b, h = c.t, c.tok, c.b, c.h
    lins = (Linear("output", tok, h, m.vocab_size // t, False),)
    logits = tok * m.vocab_size / t
    # Cross-entropy over vocabulary-parallel logits: write bf16 logits, read them into
    # an fp32 softmax, write the fp32 gradient, cast it back (about 16 B per logit).
    # TE's fused loss: the GEMM writes the bf16 logits, one forward pass reads them, the
    # backward reads them and writes the gradient in place (8 B per logit).
    per_logit = TE_FUSED_LOSS_TRAFFIC_PER_LOGIT if sh.fused_loss else 16.0
    upcast = stream = 0.0
    if sh.engine:
        per_logit, upcast, stream = engine_loss_traffic_per_logit(m, sh)
    hbm = per_logit * logits + 5.0 * h * tok / t * b
    params = m.vocab_size * h / t + (2 * h if m.norm == "layernorm1p" else h)
    # The final norm's input and output (the head stays in BF16).
    return LayerWork("head", lins, hbm_bytes=hbm, act_bytes=h * (tok / t + c.head_gathered) * b,
                     params=params, input_bytes=c.input_bytes, upcast_bytes=upcast * logits,
                     stream_bytes=stream * logits, tp_gather_bytes=(c.gather,) if t > 1 else ())


def engine_loss_traffic_per_logit(m: ModelSpec, sh: Shape) -> tuple[float, float, float]:
    """(memory-bound, eager upcast, streaming) bytes per logit of the engine's loss
    (engine/loss.py), forward + backward. The forward upcasts the bf16 logits (read 2,
    write 4) and takes their log-softmax (read 4, write 4); the backward zeroes the
    fp32 gradient for the NLL's scatter (4), runs the log-softmax's backward (read the
    gradient and the output, write 4: 12) and casts the gradient down (read 4, write 2).
    A chunked loss is checkpointed: its backward upcasts and takes the log-softmax again,
    and the chunks' gradients are concatenated into the logits' (read 2, write 2)."""
    b = sh.act_bytes
    chunked = sh.tokens * m.vocab_size / sh.tp > LOSS_CHUNK_ELEMENTS
    forwards = 2 if chunked else 1
    upcast = forwards * (b + 4.0) if b < 4 else 0.0
    downcast = 4.0 + b if b < 4 else 0.0
    hbm = forwards * 8.0 + 12.0
    stream = 4.0 + downcast + (2.0 * b if chunked else 0.0)
    return hbm, upcast, stream


_KIND_WORK = {"attention": _attention_work, "mlp": _mlp_work, "moe": _moe_work, "mamba": _mamba_work, "embedding": _embedding_work, "head": _head_work}


def layer_work(m: ModelSpec, kind: str, sh: Shape) -> LayerWork:
    """Work of one layer of a kind ('attention', 'mlp', 'moe', 'mamba', 'embedding',
    'head')."""
    if kind not in _KIND_WORK:
        raise ValueError(f"unknown layer kind {kind!r}; kinds: {', '.join(KINDS)}")
    return _KIND_WORK[kind](m, sh, _common(m, sh))


def ssd_scan_bytes(m: ModelSpec, sh: Shape) -> float:
    """HBM bytes per token the Mamba-2 SSD scan's kernels move on one tensor-parallel rank,
    forward + backward, as Megatron-LM trains with them (mamba_split_conv1d_scan_combined:
    the gate z applied inside the scan, the backward recomputing the chunk states).

    Counted from the kernels of state-spaces/mamba @e9594ce (mamba_ssm/ops/triton/ssd_*.py;
    Megatron-LM @d98e8a6 megatron/core/ssm/mamba_mixer.py for the call): each kernel's
    tensors once, per token, with H heads of P, G groups of state N, chunks of Q:
    - x, dout, z and their like (H P elements each): 22 passes (forward: chunk-state reads
      x, chunk-scan reads x and z and writes the output and the gated output; backward:
      the dstates, dx, dB, dC, dCB, ddA and dz kernels);
    - chunk states, H P N / Q per token: 8 passes in fp32 (chunk-state's output and
      state-passing's input, forward and in the backward's recompute, state-passing's fp32
      output there, dstates written and read twice) and 7 in bf16 (state-passing's output
      read by chunk-scan; the converted states and dstates the backward's dx, dB and dC
      kernels read);
    - B and C (G N each): 15 passes; their fp32 gradient partials (two head splits) and
      the sums over them: 12 passes of 4 G N bytes;
    - C B^T, G Q x Q per chunk in fp32: 12 passes;
    - dt, its cumulative sums and their gradients (fp32, H per token): 43 passes; the raw
      dt and its gradient (bf16): 4; the final states (H P N per sequence, fp32): 2.
    With H 32, P 64, G 1, N 256, Q 128 (a TP8 rank of Nemotron-H 56B) that is 311 KB per
    token, of which 188 KB are the chunk states."""
    t = sh.tp
    H, P, N, Q = m.mamba_heads / t, m.mamba_head_dim, m.mamba_state, m.mamba_chunk
    G = max(1, m.mamba_groups // t)
    b = sh.act_bytes
    states = H * P * N / Q
    return (22 * b * H * P + (8 * 4 + 7 * b) * states + 15 * b * G * N + 12 * 4 * G * N
            + 12 * 4 * G * Q + 43 * 4 * H + 4 * b * H + 2 * 4 * H * P * N / sh.seq_len)


LOSS_CHUNK_ELEMENTS = 2 ** 27
"""fp32 logits one chunk of the engine's chunked loss holds (engine/loss.py's
CHUNK_ELEMENTS; a test keeps the two equal, this module stays free of torch)."""


# Megatron-LM's vocabulary-parallel cross entropy at its peak, per logit: bf16 logits (2 B),
# the fp32 softmax kept for the backward (4 B) and the fp32 gradient it becomes (4 B).
UNFUSED_LOSS_BYTES_PER_LOGIT = 10.0
# Transformer Engine's fused cross entropy (transformer_engine/pytorch/triton/
# cross_entropy.py @02965d2): the forward's online-softmax pass keeps per-row max and sum
# (fp32, 3 per token) and saves the bf16 logits themselves, and the backward writes the
# gradient into them in place: 2 B per logit at the loss, and 8 B of traffic per logit
# (the GEMM's write, the forward's read, the backward's read and write).
TE_FUSED_LOSS_BYTES_PER_LOGIT = 2.0
TE_FUSED_LOSS_TRAFFIC_PER_LOGIT = 8.0


def logits_bytes(m: ModelSpec, sh: Shape) -> float:
    """Peak memory of the loss on the last stage: bf16 logits (2 B), the fp32 softmax kept
    for the backward (4 B) and the fp32 gradient it becomes (4 B) per logit (Megatron-LM's
    vocabulary-parallel cross-entropy).

    trainbench's engine cuts the loss into checkpointed chunks once a rank's logits (its
    1/TP of the vocabulary under TP) exceed one chunk (engine/loss.py): then only the
    logits and their gradient, in the compute dtype, are whole, and the fp32 copy,
    softmax and gradient exist for one chunk at a time."""
    logits = sh.tokens * m.vocab_size / sh.tp
    if sh.engine and logits > LOSS_CHUNK_ELEMENTS:
        return 2.0 * sh.act_bytes * logits + 12.0 * LOSS_CHUNK_ELEMENTS
    if sh.fused_loss:
        return TE_FUSED_LOSS_BYTES_PER_LOGIT * logits
    return UNFUSED_LOSS_BYTES_PER_LOGIT * logits


def block_kinds(m: ModelSpec) -> list[tuple[str, ...]]:
    """The model's pipeline units in order: a transformer block is (attention, mlp); each
    character of a hybrid pattern is one unit."""
    if m.is_hybrid:
        return [(LAYER_KINDS[c],) for c in m.pattern]
    if m.is_moe:
        dense = m.first_dense_layers
        return [("attention", "mlp")] * dense + [("attention", "moe")] * (m.layers - dense)
    return [("attention", "mlp")] * m.layers


def pipeline_chunks(m: ModelSpec, pp: int, vp: int, split: str = "") -> list[list[str]]:
    """Layer kinds of each virtual pipeline stage (pp * vp of them, in model order).

    `split`, a Megatron pipeline layout (pp_split.py), places the layers when given.
    Otherwise layers divide evenly over the stages, the embedding joining the first and
    the head the last; or NeMo counts the embedding and the loss as one layer each
    (Llama 3.1 405B: 126 + 2 = 128 = PP8 x VP8 x 2). Anything else is split as evenly as
    possible (plan validation normally rejects it).
    """
    units = block_kinds(m)
    stages = pp * vp
    n = len(units)
    if split:
        chunks, start = [], 0
        for count in layer_counts(split, stages, n):
            chunks.append([k for u in units[start:start + count] for k in u])
            start += count
        chunks[0].insert(0, "embedding")
        chunks[-1].append("head")
        return chunks
    if n % stages == 0 or (n + 2) % stages != 0:
        bounds = [round(i * n / stages) for i in range(stages + 1)]
        chunks = [[k for u in units[bounds[i]:bounds[i + 1]] for k in u] for i in range(stages)]
        chunks[0].insert(0, "embedding")
        chunks[-1].append("head")
        return chunks
    seq: list[tuple[str, ...]] = [("embedding",)] + units + [("head",)]
    per = (n + 2) // stages
    return [[k for u in seq[i * per:(i + 1) * per] for k in u] for i in range(stages)]


def rank_chunks(chunks: list[list[str]], pp: int) -> list[list[list[str]]]:
    """Virtual stages held by each pipeline rank: rank r holds r, r + pp, r + 2 pp, ...
    (the interleaved schedule of Narayanan et al. 2021)."""
    return [chunks[r::pp] for r in range(pp)]
