"""DeepSeek-V3: multi-head latent attention (MLA) and DeepSeekMoE.

DeepSeek-AI, "DeepSeek-V3 Technical Report" (arXiv 2412.19437), sec. 2.1:
- MLA: the query goes through a low-rank bottleneck (q_lora_rank, with an RMSNorm); keys
  and values are rebuilt per head from one shared latent of kv_lora_rank (with an
  RMSNorm). Each head's query and key have a "nope" part (no position) and a RoPE part;
  the key's RoPE part is decoupled from the latent and shared by all heads.
- the first `first_dense_layers` blocks (3) have a dense SwiGLU MLP, the others a
  mixture of experts (moe.py: sigmoid router, group-limited top-8 of 256, one shared
  expert, auxiliary-loss-free bias and the sequence-wise balance loss).

Left out: multi-token prediction (off by default in the issue; the 671B count is the
main model's), YaRN (the 128K context extension after pre-training), and the
interleaved RoPE pair layout of the released weights: trainbench rotates pairs of
halves as in transformer.py, which for weights trained from scratch is the same model up
to a permutation of the RoPE columns.

Same conventions as transformer.py: no parallelism in here; `layers` is a ModuleDict
keyed by the global layer index; `tok_embeddings`, `norm` and `output` may be None on a
pipeline stage; build on meta, then `to_empty(device=...)` and `init_weights()`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainbench.catalog.models import ModelSpec
from trainbench.engine.models.moe import INIT_STD, MoE
from trainbench.engine.models.transformer import (
    MLP,
    RMSNorm,
    Transformer,
    apply_rotary,
    build_norm,
)


def mla_rope_frequencies(spec: ModelSpec, device: torch.device | str | None = None
                         ) -> torch.Tensor:
    """Inverse frequencies base^(-2i/d) over the qk_rope_head_dim rotated dims."""
    d = spec.qk_rope_head_dim
    exponents = torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d
    return 1.0 / (spec.rope_base ** exponents)


class MLAttention(nn.Module):
    """Causal multi-head latent attention, no biases."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        h, n = spec.hidden, spec.heads
        self.nope, self.rope_dim, self.v_dim = (spec.qk_nope_head_dim, spec.qk_rope_head_dim,
                                                spec.v_head_dim)
        self.kv_rank = spec.kv_lora_rank
        qk = self.nope + self.rope_dim
        self.softmax_scale = 1.0 / math.sqrt(qk)
        if spec.q_lora_rank:
            self.wq_a = nn.Linear(h, spec.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(spec.q_lora_rank, spec.norm_eps)
            self.wq_b = nn.Linear(spec.q_lora_rank, n * qk, bias=False)
            self.wq = None
        else:
            self.wq_a = self.q_norm = self.wq_b = None
            self.wq = nn.Linear(h, n * qk, bias=False)
        # Down to the latent plus the one RoPE key all heads share.
        self.wkv_a = nn.Linear(h, self.kv_rank + self.rope_dim, bias=False)
        self.kv_norm = RMSNorm(self.kv_rank, spec.norm_eps)
        self.wkv_b = nn.Linear(self.kv_rank, n * (self.nope + self.v_dim), bias=False)
        self.wo = nn.Linear(n * self.v_dim, h, bias=False)

    def init_weights(self, out_std: float) -> None:
        for linear in (self.wq, self.wq_a, self.wq_b, self.wkv_a, self.wkv_b):
            if linear is not None:
                nn.init.normal_(linear.weight, std=INIT_STD)
        for norm in (self.q_norm, self.kv_norm):
            if norm is not None:
                norm.reset_parameters()
        nn.init.normal_(self.wo.weight, std=out_std)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of q, k [b, heads, s, nope+rope] over v [b, heads, s, v_dim]."""
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)

    def shared_rope_key(self, k_rope: torch.Tensor) -> torch.Tensor:
        """The RoPE key all heads share, as it enters the heads. Tensor parallelism
        replaces this identity: each rank holds some of the heads, so the key's gradient
        must be summed over the ranks (engine/parallel/tp.py)."""
        return k_rope

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        b, s, _ = x.shape
        # The latents: q's (or x itself without a low-rank query), kv's, and the one
        # RoPE key all heads share.
        q_latent = x if self.wq is not None else self.q_norm(self.wq_a(x))
        latent, k_rope = self.wkv_a(x).split([self.kv_rank, self.rope_dim], dim=-1)
        k_rope = self.shared_rope_key(apply_rotary(k_rope.unsqueeze(2), *rope))  # one head
        out = self.heads(q_latent, self.kv_norm(latent), k_rope, rope)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))

    def heads(self, q_latent: torch.Tensor, kv_latent: torch.Tensor, k_rope: torch.Tensor,
              rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Every head's attention from the latents: the up-projections, RoPE on the
        queries, core attention. [b, heads, s, v_dim]. A seam: selective recompute keeps
        only the latents for it (engine/parallel/__init__.py)."""
        b, s, _ = kv_latent.shape
        q = self.wq(q_latent) if self.wq is not None else self.wq_b(q_latent)
        q = q.view(b, s, -1, self.nope + self.rope_dim)
        q_nope, q_rope = q.split([self.nope, self.rope_dim], dim=-1)
        kv = self.wkv_b(kv_latent).view(b, s, -1, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        q = torch.cat((q_nope, apply_rotary(q_rope, *rope)), dim=-1)
        k = torch.cat((k_nope, k_rope.expand(-1, -1, k_nope.shape[2], -1)), dim=-1)
        return self.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))


class DeepSeekV3Block(nn.Module):
    """x + mla(norm(x)), then x + mlp(norm(x)): a dense SwiGLU or a mixture of experts."""

    def __init__(self, spec: ModelSpec, dense: bool):
        super().__init__()
        self.attention_norm = build_norm(spec)
        self.attention = MLAttention(spec)
        self.mlp_norm = build_norm(spec)
        self.mlp: nn.Module = MLP(spec.hidden, spec.ffn, "swiglu") if dense else MoE(spec)

    def init_weights(self, out_std: float) -> None:
        self.attention_norm.reset_parameters()
        self.attention.init_weights(out_std)
        self.mlp_norm.reset_parameters()
        self.mlp.init_weights(out_std)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        return x + self.mlp(self.mlp_norm(x))


class DeepSeekV3(Transformer):
    """Token embedding, `first_dense_layers` dense blocks then MoE blocks, final norm,
    untied output head: the Transformer trunk with MLA blocks. No multi-token prediction
    module."""

    @staticmethod
    def check_spec(spec: ModelSpec) -> None:
        if not spec.is_moe or not spec.is_mla:
            raise ValueError(f"DeepSeekV3 needs experts and MLA dims; {spec.name} has "
                             f"{spec.n_routed_experts} experts, kv_lora_rank {spec.kv_lora_rank}")

    @staticmethod
    def make_block(spec: ModelSpec, index: int) -> nn.Module:
        return DeepSeekV3Block(spec, dense=index < spec.first_dense_layers)

    @staticmethod
    def rope_table(spec: ModelSpec, device: torch.device | None = None) -> torch.Tensor:
        return mla_rope_frequencies(spec, device=device)
