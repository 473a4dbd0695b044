"""Qwen3 MoE (30B-A3B, 235B-A22B): grouped-query attention with QK-norm, and a mixture
of experts in place of the MLP in every block.

Same conventions as transformer.py, whose RMSNorm, RoPE and Attention it reuses: no
parallelism in here; `layers` is a ModuleDict keyed by the global layer index;
`tok_embeddings`, `norm` and `output` may be None on a pipeline stage; build on the
meta device, then `to_empty(device=...)` and `init_weights()`.
"""

from __future__ import annotations

import torch
from torch import nn

from trainbench.catalog.models import ModelSpec
from trainbench.engine.models.moe import MoE
from trainbench.engine.models.transformer import (
    Attention,
    RMSNorm,
    Transformer,
    apply_rotary,
    build_norm,
)


class QKNormAttention(Attention):
    """transformer.Attention with Qwen3's per-head RMSNorm on q and k, applied before
    RoPE (it keeps attention logits bounded without a softmax temperature)."""

    def __init__(self, spec: ModelSpec):
        super().__init__(spec)
        self.q_norm = RMSNorm(spec.head_dim, spec.norm_eps)
        self.k_norm = RMSNorm(spec.head_dim, spec.norm_eps)

    def init_weights(self, out_std: float) -> None:
        super().init_weights(out_std)
        self.q_norm.reset_parameters()
        self.k_norm.reset_parameters()

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_norm(self.wq(x).view(b, s, -1, self.head_dim))
        k = self.k_norm(self.wk(x).view(b, s, -1, self.head_dim))
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        out = self.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class Qwen3MoEBlock(nn.Module):
    """x + attention(norm(x)), then x + moe(norm(x))."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.attention_norm = build_norm(spec)
        self.attention = QKNormAttention(spec)
        self.mlp_norm = build_norm(spec)
        self.moe = MoE(spec)

    def init_weights(self, out_std: float) -> None:
        self.attention_norm.reset_parameters()
        self.attention.init_weights(out_std)
        self.mlp_norm.reset_parameters()
        self.moe.init_weights(out_std)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        return x + self.moe(self.mlp_norm(x))


class Qwen3MoE(Transformer):
    """Token embedding, `spec.layers` MoE blocks, final norm, untied output head: the
    Transformer trunk with Qwen3's blocks."""

    @staticmethod
    def check_spec(spec: ModelSpec) -> None:
        if not spec.is_moe or not spec.qk_norm:
            raise ValueError(f"Qwen3MoE needs experts and QK-norm; {spec.name} has "
                             f"{spec.n_routed_experts} experts, qk_norm={spec.qk_norm}")

    @staticmethod
    def make_block(spec: ModelSpec, index: int) -> nn.Module:
        return Qwen3MoEBlock(spec)
