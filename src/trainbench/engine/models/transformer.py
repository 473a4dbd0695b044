"""Decoder-only transformers of the seed workloads: Llama 2, Llama 3.1 and Nemotron-4.

One file, read top to bottom: norms, rotary position embedding, attention, MLP, block,
model. Shapes come from a `ModelSpec` (catalog/models.py); the facts behind each choice
are in ../shared/reference/architectures.md.

The module knows nothing of parallelism. Three seams let parallel code work on it
without editing it (torchtitan style):
- every view that splits heads uses -1 for the head count, so tensor-parallel sharded
  projections (fewer heads per rank) run unchanged;
- `Attention.attend(q, k, v)` holds the one attention call; context parallelism
  replaces it per module, and `positions` are passed in explicitly because a context
  shard does not hold contiguous positions;
- `tok_embeddings`, `norm` and `output` may be set to None on a pipeline stage: the
  model then takes and/or returns hidden states, and `layers` (a ModuleDict keyed by
  the global layer index) keeps every parameter name the full model has.

Build on the meta device, shard, then `to_empty(device=...)` and `init_weights()`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainbench.catalog.models import ModelSpec

INIT_STD = 0.02
"""Standard deviation of every embedding and linear weight (GPT-2 / torchtitan)."""

# Llama 3.1's RoPE frequency scaling (architectures.md). Fixed by the model, not tunable.
LLAMA3_SCALE_FACTOR = 8.0
LLAMA3_LOW_FREQ_FACTOR = 1.0
LLAMA3_HIGH_FREQ_FACTOR = 4.0
LLAMA3_ORIGINAL_CONTEXT = 8192


# --------------------------------------------------------------------------- norms


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 whatever the activation dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        # Cast back before the weight, as Hugging Face Llama does, so bf16 runs agree.
        return self.weight * normed.type_as(x)


class LayerNorm1p(nn.Module):
    """Nemotron-4's LayerNorm with a zero-centred gain: LN(x) * (1 + g) + b, g = b = 0 at init.

    Centring the gain at zero means weight decay pulls it towards the identity instead of
    towards a zero output.
    """

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))
        self.bias = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In fp32: 1 + g rounded to bf16 would lose g's small early updates.
        out = F.layer_norm(
            x.float(), (x.shape[-1],), 1.0 + self.weight.float(), self.bias.float(), self.eps)
        return out.type_as(x)


def build_norm(spec: ModelSpec) -> nn.Module:
    """The norm `spec.norm` names, over the hidden dimension."""
    if spec.norm == "rmsnorm":
        return RMSNorm(spec.hidden, spec.norm_eps)
    if spec.norm == "layernorm1p":
        return LayerNorm1p(spec.hidden, spec.norm_eps)
    raise ValueError(f"unknown norm {spec.norm!r}; expected 'rmsnorm' or 'layernorm1p'")


# --------------------------------------------------------------- rotary embedding


def rotary_dim(spec: ModelSpec) -> int:
    """How many leading dimensions of each head RoPE rotates (even)."""
    dim = int(spec.head_dim * spec.rotary_fraction)
    if dim <= 0 or dim % 2:
        raise ValueError(
            f"rotary part of a head must be a positive even size, got {dim} "
            f"(head_dim {spec.head_dim} x rotary_fraction {spec.rotary_fraction})")
    return dim


def rope_frequencies(spec: ModelSpec, device: torch.device | str | None = None) -> torch.Tensor:
    """Inverse frequencies (fp32, rotary_dim/2 of them) of each pair of rotated dims.

    f_i = base^(-2i/d) over the rotated part d; for Llama 3.1 ('llama3' scaling),
    wavelengths 2*pi/f longer than the original context (8192 / low-freq factor) are
    slowed by the factor 8, shorter than 8192 / high-freq factor kept, and the band in
    between blended linearly in 8192/w.
    """
    dim = rotary_dim(spec)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
    inv_freq = 1.0 / (spec.rope_base ** exponents)
    if spec.rope_scaling is None:
        return inv_freq
    if spec.rope_scaling != "llama3":
        raise ValueError(f"unknown rope_scaling {spec.rope_scaling!r}; expected 'llama3' or None")
    return _llama3_scaled(inv_freq)


def _llama3_scaled(inv_freq: torch.Tensor) -> torch.Tensor:
    wavelength = 2 * math.pi / inv_freq
    keep_below = LLAMA3_ORIGINAL_CONTEXT / LLAMA3_HIGH_FREQ_FACTOR  # high frequencies
    slow_above = LLAMA3_ORIGINAL_CONTEXT / LLAMA3_LOW_FREQ_FACTOR  # low frequencies
    blend = (LLAMA3_ORIGINAL_CONTEXT / wavelength - LLAMA3_LOW_FREQ_FACTOR) / (
        LLAMA3_HIGH_FREQ_FACTOR - LLAMA3_LOW_FREQ_FACTOR)
    slowed = inv_freq / LLAMA3_SCALE_FACTOR
    blended = (1 - blend) * slowed + blend * inv_freq
    scaled = torch.where(wavelength > slow_above, slowed, blended)
    return torch.where(wavelength < keep_below, inv_freq, scaled)


def rope_cos_sin(
    inv_freq: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (fp32) for `positions` ([s] or [b, s]): shape [..., s, 1, rotary_dim].

    Each frequency appears twice, once for each half of the rotated part ("rotate
    halves" layout, as in Hugging Face Llama); the singleton axis broadcasts over heads.
    """
    angles = positions.float()[..., None] * inv_freq.float()
    angles = torch.cat((angles, angles), dim=-1).unsqueeze(-2)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first cos.shape[-1] dims of each head of x [b, s, heads, head_dim].

    Pairs are (i, i + d/2) within the rotated part d; dims past d pass unchanged
    (Nemotron-4 rotates only the first half of each head).
    """
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot].float(), x[..., rot:]
    first, second = x_rot.chunk(2, dim=-1)
    rotated = x_rot * cos + torch.cat((-second, first), dim=-1) * sin
    return torch.cat((rotated.type_as(x), x_pass), dim=-1)


# ----------------------------------------------------------------------- layers


class Attention(nn.Module):
    """Causal grouped-query self-attention with RoPE, no biases."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        # Global head counts; under tensor parallelism each rank holds a share of them,
        # and the forward never relies on these numbers.
        self.n_heads = spec.heads
        self.n_kv_heads = spec.kv_heads
        self.head_dim = spec.head_dim
        self.wq = nn.Linear(spec.hidden, spec.heads * spec.head_dim, bias=False)
        self.wk = nn.Linear(spec.hidden, spec.kv_heads * spec.head_dim, bias=False)
        self.wv = nn.Linear(spec.hidden, spec.kv_heads * spec.head_dim, bias=False)
        self.wo = nn.Linear(spec.heads * spec.head_dim, spec.hidden, bias=False)

    def init_weights(self, out_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            nn.init.normal_(linear.weight, std=INIT_STD)
        nn.init.normal_(self.wo.weight, std=out_std)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of q [b, heads, s, d] over k, v [b, kv_heads, s, d].

        The one place attention is computed: context parallelism swaps it per module.
        """
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        """x [b, s, hidden] -> [b, s, hidden]; `rope` is (cos, sin), None for no positions."""
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        out = self.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """SwiGLU, down(silu(w1 x) * w3 x), or squared ReLU, down(relu(w1 x)^2), no biases."""

    def __init__(self, hidden: int, ffn: int, kind: str):
        super().__init__()
        if kind not in ("swiglu", "squared_relu"):
            raise ValueError(f"unknown mlp {kind!r}; expected 'swiglu' or 'squared_relu'")
        self.kind = kind
        self.w1 = nn.Linear(hidden, ffn, bias=False)  # gate (SwiGLU) or up (squared ReLU)
        self.w2 = nn.Linear(ffn, hidden, bias=False)  # down
        self.w3 = nn.Linear(hidden, ffn, bias=False) if kind == "swiglu" else None  # up

    def init_weights(self, out_std: float) -> None:
        nn.init.normal_(self.w1.weight, std=INIT_STD)
        if self.w3 is not None:
            nn.init.normal_(self.w3.weight, std=INIT_STD)
        nn.init.normal_(self.w2.weight, std=out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(self.activate(self.w1(x), self.w3(x)))
        return self.w2(self.activate(self.w1(x)))

    @staticmethod
    def activate(h: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
        """silu(gate) * up (SwiGLU, `up` given) or relu(h)^2."""
        if up is not None:
            return F.silu(h) * up
        return F.relu(h).square()


class TransformerBlock(nn.Module):
    """Pre-norm residual block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.attention_norm = build_norm(spec)
        self.attention = Attention(spec)
        self.mlp_norm = build_norm(spec)
        self.mlp = MLP(spec.hidden, spec.ffn, spec.mlp)

    def init_weights(self, out_std: float) -> None:
        self.attention_norm.reset_parameters()
        self.attention.init_weights(out_std)
        self.mlp_norm.reset_parameters()
        self.mlp.init_weights(out_std)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        return x + self.mlp(self.mlp_norm(x))


# ------------------------------------------------------------------------ model


class Transformer(nn.Module):
    """Token embedding, `spec.layers` blocks, final norm, untied output head.

    The decoder trunk every attention model here shares: Qwen3 MoE and DeepSeek-V3
    subclass it with their own blocks (`make_block`) and RoPE table (`rope_table`)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.check_spec(spec)
        self.spec = spec
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(spec.vocab_size, spec.hidden)
        # Keyed by global index, so a pipeline stage that drops layers keeps the names.
        self.layers = nn.ModuleDict({str(i): self.make_block(spec, i)
                                     for i in range(spec.layers)})
        self.norm: nn.Module | None = build_norm(spec)
        self.output: nn.Linear | None = nn.Linear(spec.hidden, spec.vocab_size, bias=False)
        # Not persistent: derived from the spec, recomputed by init_weights after to_empty.
        self.register_buffer("rope_inv_freq", self.rope_table(spec), persistent=False)
        self.init_weights()

    @staticmethod
    def check_spec(spec: ModelSpec) -> None:
        if spec.position_embedding != "rope":
            raise ValueError(
                f"Transformer needs RoPE, {spec.name} has position_embedding "
                f"{spec.position_embedding!r}")

    @staticmethod
    def make_block(spec: ModelSpec, index: int) -> nn.Module:
        return TransformerBlock(spec)

    @staticmethod
    def rope_table(spec: ModelSpec, device: torch.device | None = None) -> torch.Tensor:
        return rope_frequencies(spec, device=device)

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter and the RoPE table in place.

        Works on real tensors after `to_empty(device=...)` from the meta device (and is a
        no-op on meta tensors). Output projections (wo, w2) get std 0.02/sqrt(2*layers)
        so the residual stream's variance does not grow with depth (GPT-2). Uses the
        global model depth, so every pipeline stage initialises its layers alike.
        """
        self.rope_inv_freq.copy_(self.rope_table(self.spec, device=self.rope_inv_freq.device))
        init_trunk_weights(self, self.spec.layers)

    def forward(
        self, tokens_or_hidden: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Tokens [b, s] (or hidden states [b, s, hidden] on a later pipeline stage) ->
        logits [b, s, vocab] in the compute dtype (hidden states if `output` is None).

        `positions` ([s] or [b, s]) are the tokens' positions in the full sequence;
        None means 0..s-1.
        """
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens_or_hidden)
        else:
            h = tokens_or_hidden
        if positions is None:
            positions = torch.arange(h.shape[1], device=h.device)
        rope = rope_cos_sin(self.rope_inv_freq, positions)
        for layer in self.layers.values():
            h = layer(h, rope)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


def init_trunk_weights(model: nn.Module, depth: int) -> None:
    """Embedding, blocks, final norm and head of any family (each may be None on a
    pipeline stage). Residual-branch output projections get std 0.02/sqrt(2*depth) so the
    residual stream's variance does not grow with depth (GPT-2, Megatron)."""
    if model.tok_embeddings is not None:
        nn.init.normal_(model.tok_embeddings.weight, std=INIT_STD)
    out_std = INIT_STD / math.sqrt(2 * depth)
    for layer in model.layers.values():
        layer.init_weights(out_std)
    if model.norm is not None:
        model.norm.reset_parameters()
    if model.output is not None:
        nn.init.normal_(model.output.weight, std=INIT_STD)
