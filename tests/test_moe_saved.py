"""What an MoE layer keeps for its backward, counted: the routed rows' tensors at hidden
and expert width that the backward reads, and nothing it does not (engine/models/
moe_rows.py, MoE.activate). Grouped-GEMM path (the GPU's), bf16, on the CPU's
torch._grouped_mm."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import gc  # noqa: E402

from helpers import tensors_created  # noqa: E402
from trainbench.catalog.models import get_model  # noqa: E402
from trainbench.engine.models import moe as moe_mod  # noqa: E402
from trainbench.engine.models.moe import MoE, grouped_swiglu  # noqa: E402
from trainbench.engine.models.moe_rows import combine_rows, scatter_rows  # noqa: E402
from trainbench.engine.parallel import keep_only_inputs_of_cheap_ops  # noqa: E402



def _alive_after_forward(layer, x):
    """(shape of each distinct storage the forward created that is still alive once it
    returned: what the backward holds, whoever holds it), and the output."""
    with tensors_created() as created:
        out = layer(x)
    gc.collect()
    alive = {}
    for ref in created.refs:
        t = ref()
        if t is not None:
            alive.setdefault(t.untyped_storage().data_ptr(), tuple(t.shape))
    return list(alive.values()), out


@pytest.mark.parametrize("rerun", [True, False], ids=["engine", "under full recompute"])
def test_a_moe_layer_keeps_one_hidden_wide_and_three_expert_wide_row_tensors(monkeypatch,
                                                                             rerun):
    """The engine's layer (parallel.keep_only_inputs_of_cheap_ops) keeps the grouped
    GEMMs' input (w1 and w3 share it), and of the experts' activation only its inputs,
    gate, up and the gate weights, beside its output (the down projection's input). No
    expert output is kept: the gate weights scale the activation, so their gradient
    reads it, not the [rows, hidden] output. Under full recompute the block's checkpoint
    keeps none of it, so the activation is not rerun a third time: its silu(gate) and
    silu(gate) * up stay for the recomputed backward."""
    spec = get_model("pretrain_qwen3", "tiny")
    monkeypatch.setattr(moe_mod, "expert_path", lambda *a, **k: "grouped")
    torch.manual_seed(0)
    layer = MoE(spec).to(torch.bfloat16)
    layer.init_weights(0.02)
    if rerun:
        keep_only_inputs_of_cheap_ops(layer)
    tokens, h, f = 64, spec.hidden, spec.moe_ffn
    rows = tokens * spec.top_k
    x = torch.randn(1, tokens, h, dtype=torch.bfloat16, requires_grad=True)
    alive, out = _alive_after_forward(layer, x)
    assert alive.count((rows, h)) == 1, alive
    assert alive.count((rows, f)) == (3 if rerun else 5), alive
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
    token_of = torch.tensor([0, 2, 1, 0, 2, 1])
    ref = torch.zeros(3, 4, dtype=torch.float64).index_add(0, token_of, expert_out)
    grad = torch.randn(3, 4, dtype=torch.float64)
    (want,) = torch.autograd.grad(ref, expert_out, grad)
    (got,) = torch.autograd.grad(combine_rows(expert_out, token_of, 3), expert_out, grad)
    assert torch.equal(got, want)


@pytest.mark.parametrize("grouped_mm", [True, False], ids=["grouped", "loop"])
def test_gate_weights_inside_the_activation_give_the_weighted_outputs_gradients(grouped_mm):
    """Each row's gate weight applied inside the activation, before the down projection
    (MoE.activate), gives the outputs and every gradient, the weights' included, of
    the expert outputs scaled by their gate weights after it (fp32: the CPU's
    torch._grouped_mm has no float64; to fp32 rounding)."""
    torch.manual_seed(2)
    E, h, f, n = 3, 8, 16, 12
    x = torch.randn(n, h, requires_grad=True)
    w1, w3 = (torch.randn(E, f, h, requires_grad=True) for _ in range(2))
    w2 = torch.randn(E, h, f, requires_grad=True)
    gate = torch.rand(n, 1, requires_grad=True)
    counts = torch.tensor([5, 0, 7])
    leaves = (x, w1, w3, w2, gate)
    out = grouped_swiglu(x, counts, w1, w3, w2, grouped_mm=grouped_mm, weights=gate)
    ends = torch.cumsum(counts, 0).tolist()
    starts = [0] + ends[:-1]
    ref = torch.cat([(torch.nn.functional.silu(x[a:b] @ w1[e].T) * (x[a:b] @ w3[e].T)) @ w2[e].T
                     for e, (a, b) in enumerate(zip(starts, ends))]) * gate
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, grad)
    want = torch.autograd.grad(ref, leaves, grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
