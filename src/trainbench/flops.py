"""Model FLOPs per sequence (forward + backward) under two named conventions.

- ``published``: exactly the formula the seed prints for the workload, so trainbench
  reproduces the seeds' MFU figures (attention counted as non-causal).
- ``causal``: Megatron-LM's count, attention scores halved for the causal mask; hybrid
  models count each layer kind separately.

The MoE families (Qwen3 MoE, DeepSeek-V3) have no seed, and no source formula was
found to cite, so their ``published`` count is the standard 6 x (active parameters'
multiply-adds) count documented in `moe_breakdown`, with attention scores non-causal as
the Llama seeds count them; ``causal`` is the same count with the scores halved. Only
the experts a token is routed to (top_k) and the shared ones count, plus the router GEMM.

An MFU figure must always say which convention produced it. Pure Python, no torch.
"""

from __future__ import annotations

from .catalog.models import ModelSpec

CONVENTIONS = ("published", "causal")


def _published_llama(m: ModelSpec, s: int) -> dict[str, float]:
    # Seeds 001/002 "Notes": 12*L*h^2*(1 + g/n + s/h), 18*L*ffn*h, 6*V*h, times s.
    L, h = m.layers, m.hidden
    return {
        "attention": s * 12 * L * h**2 * (1 + m.kv_heads / m.heads + s / h),
        "mlp": s * 18 * L * m.ffn * h,
        "embedding": s * 6 * m.vocab_size * h,
    }


def _published_nemotron4(m: ModelSpec, s: int) -> dict[str, float]:
    # Seeds 000/003 "Notes": 24*L*h^2 + 12*L*h*s, 48*L*h^2 (assumes ffn = 4h), 6*V*h, times s.
    L, h = m.layers, m.hidden
    return {
        "attention": s * (24 * L * h**2 + 12 * L * h * s),
        "mlp": s * 48 * L * h**2,
        "embedding": s * 6 * m.vocab_size * h,
    }


# Seed 004 evaluates its Mamba term with chunk_size 256, though the model scans in
# chunks of 128; the published convention keeps the seed's number.
PUBLISHED_NEMOTRONH_CHUNK = 256


def _published_nemotronh(m: ModelSpec, s: int) -> dict[str, float]:
    # Seed 004 "Notes", every term times 6 at the end.
    c = m.layer_counts()
    h = m.hidden
    mlp = 2 * s * h * m.ffn * c["mlp"]
    attn = (2 * s * h * m.heads * m.head_dim + 2 * s * h * m.kv_heads * m.head_dim
            + 2 * s * s * h) * c["attention"]
    mamba = (s * h * (m.mamba_heads * m.mamba_head_dim * 3 + m.mamba_groups * m.mamba_state * 2
                      + m.mamba_heads)
             + s * h * m.mamba_expand * PUBLISHED_NEMOTRONH_CHUNK
             + 2 * s * h * m.mamba_expand * m.mamba_state
             + s * PUBLISHED_NEMOTRONH_CHUNK * m.mamba_state * m.mamba_groups) * c["mamba"]
    head = s * h * m.vocab_size
    return {"attention": 6 * attn, "mlp": 6 * mlp, "mamba": 6 * mamba, "embedding": 6 * head}


def attention_layer_flops_causal(m: ModelSpec, s: int) -> float:
    """One attention layer, one sequence, fwd+bwd (x3), 2 FLOPs per multiply-add.

    Projections: q and out h x (n*d), k and v h x (g*d). Scores QK^T and AV: 2*s*n*d
    multiply-adds per token, halved by the causal mask (Megatron-LM, Narayanan et al. 2021).
    """
    qo = 2 * m.hidden * m.heads * m.head_dim
    kv = 2 * m.hidden * m.kv_heads * m.head_dim
    scores = s * m.heads * m.head_dim  # 2 matmuls x s*n*d MACs / 2 for causal
    return 6 * s * (qo + kv + scores)


def mlp_layer_flops(m: ModelSpec, s: int) -> float:
    """One MLP layer, fwd+bwd: 3 matrices for SwiGLU, 2 for squared ReLU."""
    return 6 * s * (3 if m.mlp == "swiglu" else 2) * m.hidden * m.ffn


def mamba_layer_flops(m: ModelSpec, s: int) -> float:
    """One Mamba-2 layer, fwd+bwd: projections plus the chunked SSD scan.

    SSD per token and head (Dao & Gu 2024, "minimal" form): C.B^T and its product with X
    inside a chunk of Q against the positions before it (causal: Q/2 of them on average,
    so Q/2*(N+P) MACs, halved as attention's scores are), the chunk state B (x) X (N*P
    MACs) and the output from the carried state (N*P MACs).
    """
    h, H, P, N, G = m.hidden, m.mamba_heads, m.mamba_head_dim, m.mamba_state, m.mamba_groups
    d_inner = H * P
    proj = h * (2 * d_inner + 2 * G * N + H) + d_inner * h
    conv = (d_inner + 2 * G * N) * m.mamba_conv_kernel
    Q = m.mamba_chunk
    scan = H * (Q / 2 * (N + P) + 2 * N * P)
    return 6 * s * (proj + conv + scan)


def mla_layer_flops(m: ModelSpec, s: int, causal: bool = True) -> float:
    """One multi-head latent attention layer (DeepSeek-V3), fwd+bwd, from its real
    projections: query down/up (or one projection without q_lora_rank), the latent and
    shared RoPE key down-projection, the latent's up-projection to per-head keys (nope
    part) and values, the output; then QK^T over nope+rope dims and AV over v dims."""
    h, n = m.hidden, m.heads
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    q = h * m.q_lora_rank + m.q_lora_rank * n * qk if m.q_lora_rank else h * n * qk
    kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * n * (
        m.qk_nope_head_dim + m.v_head_dim)
    out = n * m.v_head_dim * h
    scores = s * n * (qk + m.v_head_dim) * (0.5 if causal else 1.0)
    return 6 * s * (q + kv + out + scores)


def moe_layer_flops(m: ModelSpec, s: int) -> float:
    """One MoE MLP, fwd+bwd: the router GEMM (hidden x experts) and the SwiGLU of the
    top_k routed experts and the shared ones each token passes through."""
    h = m.hidden
    return 6 * s * (h * m.n_routed_experts
                    + (m.top_k + m.n_shared_experts) * 3 * h * m.moe_ffn)


def moe_breakdown(m: ModelSpec, s: int, causal: bool) -> dict[str, float]:
    """FLOPs of a MoE model by part: attention (GQA or MLA), the first dense MLPs, the
    MoE MLPs (active experts + router) and the output head."""
    c = m.layer_counts()
    if m.is_mla:
        attention = mla_layer_flops(m, s, causal)
    else:
        attention = attention_layer_flops_causal(m, s)
        if not causal:  # the scores term again: counted in full
            attention += 6 * s * s * m.heads * m.head_dim
    return {
        "attention": c["attention"] * attention,
        "mlp": c["mlp"] * mlp_layer_flops(m, s),
        "moe": c["moe"] * moe_layer_flops(m, s),
        "embedding": 6 * s * m.hidden * m.vocab_size,
    }


def _causal(m: ModelSpec, s: int) -> dict[str, float]:
    if m.is_moe:
        return moe_breakdown(m, s, causal=True)
    c = m.layer_counts()
    return {
        "attention": c["attention"] * attention_layer_flops_causal(m, s),
        "mlp": c["mlp"] * mlp_layer_flops(m, s),
        "mamba": c["mamba"] * mamba_layer_flops(m, s) if c["mamba"] else 0.0,
        "embedding": 6 * s * m.hidden * m.vocab_size,  # output head; the lookup is free
    }


def flops_breakdown(m: ModelSpec, seq_len: int | None = None,
                    convention: str = "published") -> dict[str, float]:
    """FLOPs per sequence by part ('attention', 'mlp', 'mamba', 'embedding'; MoE models:
    'attention', 'mlp', 'moe', 'embedding')."""
    s = seq_len or m.seq_len
    if convention == "causal":
        return _causal(m, s)
    if convention != "published":
        raise ValueError(f"unknown FLOPs convention {convention!r}; use one of {CONVENTIONS}")
    if m.family == "llama":
        return _published_llama(m, s)
    if m.family == "nemotron4":
        return _published_nemotron4(m, s)
    if m.family == "nemotronh":
        return _published_nemotronh(m, s)
    if m.is_moe:
        return moe_breakdown(m, s, causal=False)
    raise ValueError(f"no published FLOPs formula for family {m.family!r}")


def flops_per_sequence(m: ModelSpec, seq_len: int | None = None,
                       convention: str = "published") -> float:
    """Model FLOPs of one sequence, forward and backward (the seeds' "GBS=1" figure)."""
    return float(sum(flops_breakdown(m, seq_len, convention).values()))


def round_sig(x: float, digits: int = 3) -> float:
    """Round to significant digits, as the seeds print FLOPs (4.74E+14)."""
    if x == 0:
        return 0.0
    return float(f"{x:.{digits - 1}e}")
