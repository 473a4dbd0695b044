"""What an MoE layer keeps for its backward, counted: the routed rows' tensors at hidden
and expert width that the backward reads, and nothing it does not (engine/models/
moe_rows.py). Grouped-GEMM path (the GPU's), bf16, on the CPU's torch._grouped_mm."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.autograd.graph import saved_tensors_hooks  # noqa: E402

from trainbench.catalog.models import get_model  # noqa: E402
from trainbench.engine.models import moe as moe_mod  # noqa: E402
from trainbench.engine.models.moe import MoE, grouped_swiglu  # noqa: E402
from trainbench.engine.models.moe_rows import scatter_rows, weighted_combine  # noqa: E402


def _distinct_saved(fn):
    """(shape, dtype) of each distinct tensor autograd saves while fn runs."""
    seen = {}

    def pack(t):
        seen[(t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))] = (
            tuple(t.shape), t.dtype)
        return t
    with saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return list(seen.values()), out


def test_a_moe_layer_keeps_two_hidden_wide_and_three_expert_wide_row_tensors(monkeypatch):
    spec = get_model("pretrain_qwen3", "tiny")
    monkeypatch.setattr(moe_mod, "expert_path", lambda *a, **k: "grouped")
    torch.manual_seed(0)
    layer = MoE(spec).to(torch.bfloat16)
    layer.init_weights(0.02)
    tokens, h, f = 64, spec.hidden, spec.moe_ffn
    rows = tokens * spec.top_k
    x = torch.randn(1, tokens, h, dtype=torch.bfloat16, requires_grad=True)
    saved, out = _distinct_saved(lambda: layer(x))
    hidden_rows = [s for s, _ in saved if s == (rows, h)]
    ffn_rows = [s for s, _ in saved if s == (rows, f)]
    # The grouped GEMMs' input (w1 and w3 share it) and the expert outputs the gates'
    # gradient reads; gate and up, and their product (the down projection's input).
    assert len(hidden_rows) == 2, saved
    assert len(ffn_rows) == 3, saved
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()


def test_row_functions_give_autograds_own_gradients():
    torch.manual_seed(1)
    x = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    dest = torch.tensor([5, 0, 2, 7, 1, 3])
    ref = torch.zeros(8, 4, dtype=torch.float64).index_copy(0, dest, x)
    grad = torch.randn(8, 4, dtype=torch.float64)
    (want,) = torch.autograd.grad(ref, x, grad)
    (got,) = torch.autograd.grad(scatter_rows(x, dest, 8), x, grad)
    assert torch.equal(got, want)

    expert_out = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    gate = torch.rand(6, 1, dtype=torch.float64, requires_grad=True)
    token_of = torch.tensor([0, 2, 1, 0, 2, 1])
    ref = torch.zeros(3, 4, dtype=torch.float64).index_add_(0, token_of, expert_out * gate)
    grad = torch.randn(3, 4, dtype=torch.float64)
    want = torch.autograd.grad(ref, (expert_out, gate), grad)
    got = torch.autograd.grad(weighted_combine(expert_out, gate, token_of, 3),
                              (expert_out, gate), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0)


def test_grouped_swiglu_keeps_autograds_gradients():
    torch.manual_seed(2)
    E, h, f, n = 3, 8, 16, 12
    x = torch.randn(n, h, requires_grad=True)
    w1, w3 = (torch.randn(E, f, h, requires_grad=True) for _ in range(2))
    w2 = torch.randn(E, h, f, requires_grad=True)
    counts = torch.tensor([5, 0, 7])
    out = grouped_swiglu(x, counts, w1, w3, w2, grouped_mm=True)
    ends = torch.cumsum(counts, 0).tolist()
    starts = [0] + ends[:-1]
    ref = torch.cat([(torch.nn.functional.silu(x[a:b] @ w1[e].T) * (x[a:b] @ w3[e].T)) @ w2[e].T
                     for e, (a, b) in enumerate(zip(starts, ends))])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, w1, w3, w2), grad)
    want = torch.autograd.grad(ref, (x, w1, w3, w2), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
