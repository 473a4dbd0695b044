"""While tracing: attention whose value heads are narrower than its query and key heads
(DeepSeek-V3's MLA: 192 against 128) holds the memory a GPU's fused kernel holds.

For such heads a CPU's `scaled_dot_product_attention` takes its math path: it builds the
whole [heads, seq, seq] score matrix, its softmax and, in the backward, their gradients,
4 GiB each at DeepSeek-V3's 64 heads a TP2 rank and 4,096 tokens. A GPU runs a fused
kernel (cuDNN's, or the memory-efficient one) that keeps only the output and each row's
log-sum-exp for the backward, which writes the three input gradients. `check` traces what
a GPU holds, so while it traces, these calls go to a stand-in that allocates what the
fused kernel allocates. Under the trace's FakeTensorMode no value is ever read; the
stand-in computes none. Heads of one width keep the CPU's own flash kernel, which holds
what a GPU's does.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F


class _FusedAttentionMemory(torch.autograd.Function):
    """q [b, h, s, d], k [b, h, s, d], v [b, h, s, dv] -> out [b, h, s, dv], keeping q, k,
    v, out and the fp32 log-sum-exp [b, h, s] as a fused kernel does; the backward writes
    the three input gradients."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = q.new_empty(q.shape[:-1] + (v.shape[-1],), dtype=v.dtype)
        log_sum_exp = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, log_sum_exp)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _query_key_value(args: tuple, kwargs: dict) -> tuple:
    return tuple(args[i] if i < len(args) else kwargs.get(name)
                 for i, name in enumerate(("query", "key", "value")))


@contextlib.contextmanager
def fused_attention_memory():
    """Attention with narrower value heads traced as a GPU's fused kernel holds it.

    torch.nn.functional's attribute is replaced, not intercepted by a TorchFunctionMode:
    a checkpoint's recomputation in the backward runs outside such a mode, and would
    rebuild the math path's tensors where the forward made the stand-in's. The attribute
    is put back when the trace ends."""
    sdpa = F.scaled_dot_product_attention

    def attention(*args, **kwargs):
        q, k, v = _query_key_value(args, kwargs)
        if q.shape[-1] != v.shape[-1]:
            return _FusedAttentionMemory.apply(q, k, v)
        return sdpa(*args, **kwargs)
    F.scaled_dot_product_attention = attention
    try:
        yield
    finally:
        F.scaled_dot_product_attention = sdpa
