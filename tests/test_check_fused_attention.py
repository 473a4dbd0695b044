"""check's stand-in for attention with narrower value heads (check/fused_attention.py):
while tracing, it holds what a GPU's fused kernel holds, never the math path's
[heads, seq, seq] scores; heads of one width still run torch's own kernel."""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from helpers import tensors_created  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from trainbench.check.fused_attention import fused_attention_memory  # noqa: E402

SEQ = 64


def _qkv(v_dim: int):
    torch.manual_seed(0)
    q, k = (torch.randn(1, 4, SEQ, 24, requires_grad=True) for _ in range(2))
    return q, k, torch.randn(1, 4, SEQ, v_dim, requires_grad=True)


def _scores_made(standin: bool, v_dim: int) -> bool:
    """Whether a recomputed (checkpointed, as selective recompute runs it) attention's
    forward and backward create a [.., seq, seq] tensor."""
    q, k, v = _qkv(v_dim)

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    standin_or_not = fused_attention_memory() if standin else contextlib.nullcontext()
    with standin_or_not, tensors_created() as made:
        out = checkpoint(attend, q, k, v, use_reentrant=False)
        out.sum().backward()
    assert out.shape == (1, 4, SEQ, v_dim)
    assert q.grad.shape == q.shape and v.grad.shape == v.shape
    return any(s[-2:] == (SEQ, SEQ) for s in made.shapes)


def test_narrower_value_heads_hold_no_score_matrix_under_the_standin():
    assert _scores_made(standin=False, v_dim=16)  # the CPU's math path: the control
    assert not _scores_made(standin=True, v_dim=16)


def test_heads_of_one_width_keep_torchs_own_kernel():
    q, k, v = _qkv(24)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with fused_attention_memory():
        got = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(got, want)
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention  # put back
