"""The routed experts' computation (engine/models/moe.py, issue 35): which path runs
where, the work its backward does as the expert count grows, the token-group padding of
the low-precision grouped GEMMs, and that no operator of the grouped path makes a GPU
wait for its host.

No wall clock here: the work is counted as the elements every operator of the backward
writes (a TorchDispatchMode), which a per-expert `w1[e]` select made O(E^2 f h) per layer
(each select's backward writes a zero gradient of the whole [E, f, h] weight) and which
must be O(E f h + tokens).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from trainbench.catalog.models import get_model
from trainbench.engine.models import moe as moe_mod
from trainbench.engine.models.moe import (
    MoE,
    compute_dtype,
    expert_counts,
    expert_path,
    grouped_swiglu,
    pad_token_groups,
)

QWEN_TINY = get_model("pretrain_qwen3", "tiny")


pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------- path selection


def test_the_grouped_gemm_runs_fp32_master_weights_under_bf16_autocast_on_hopper():
    """A one-rank bf16 run keeps fp32 weights and activations and computes under bf16
    autocast: the compute dtype is autocast's, and a CUDA device with torch._grouped_mm
    (Hopper and later) takes the grouped GEMM for it. The 235B proxy ran the per-expert
    loop there because the choice looked at the activations' dtype (fp32)."""
    x = torch.randn(4, 8)
    assert compute_dtype(x) == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        dtype = compute_dtype(x)
    assert dtype == torch.bfloat16
    hopper = dict(grouped_mm_kernel=True, capability=(9, 0), low_precision=False)
    assert expert_path("cuda", dtype, **hopper) == "grouped"
    assert expert_path("cuda", torch.bfloat16, **dict(hopper, capability=(10, 0))) == "grouped"
    # Elsewhere the loop: a CPU, an Ampere GPU (torch's _grouped_mm there copies the
    # offsets to the host and loops), a torch without _grouped_mm, fp32 compute.
    assert expert_path("cpu", dtype, **dict(hopper, capability=None)) == "loop"
    assert expert_path("cuda", dtype, **dict(hopper, capability=(8, 0))) == "loop"
    assert expert_path("cuda", dtype, **dict(hopper, grouped_mm_kernel=False)) == "loop"
    assert expert_path("cuda", torch.float32, **hopper) == "loop"
    # torchao's FP8/MXFP8 wrappers always take the grouped GEMM (MXFP8 emulated off GPU).
    assert expert_path("cpu", dtype, grouped_mm_kernel=True, capability=None,
                       low_precision=True) == "grouped"


def test_grouped_swiglu_computes_in_autocasts_dtype_on_either_path():
    """Under bf16 autocast with fp32 master weights both paths cast the weights once and
    return bf16; the grouped GEMM (forced here: torch's CPU _grouped_mm) and the loop give
    the same rows, and the fp32 weights get fp32 gradients from either."""
    torch.manual_seed(0)
    E, d, f = 4, 16, 32
    weights = [torch.randn(E, f, d) * 0.1, torch.randn(E, f, d) * 0.1, torch.randn(E, d, f) * 0.1]
    counts = torch.tensor([3, 0, 6, 7])
    x = torch.randn(16, d)
    results = []
    for grouped in (True, False):
        leaves = [w.clone().requires_grad_() for w in weights]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = grouped_swiglu(x, counts, *leaves, grouped_mm=grouped)
        assert out.dtype == torch.bfloat16
        out.float().square().sum().backward()
        assert all(w.grad.dtype == torch.float32 for w in leaves)
        results.append((out.float(), *(w.grad for w in leaves)))
    for grouped, loop in zip(*results):
        torch.testing.assert_close(grouped, loop, rtol=2e-2, atol=1e-3)


# --------------------------------------------------------------- backward work in E


class ElementsWritten(TorchDispatchMode):
    """Sums the elements of every tensor an operator returns (views, which write
    nothing, left out)."""

    def __init__(self):
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            self.elements += sum(t.numel() for t in tree_leaves(out)
                                 if isinstance(t, torch.Tensor))
        return out


def backward_elements(n_experts: int, grouped_mm: bool, tokens: int = 512) -> int:
    """Elements written by the backward of one MoE layer (hidden 64, expert width 32,
    top-4) over `tokens` tokens with `n_experts` routed experts."""
    spec = replace(QWEN_TINY, hidden=64, moe_ffn=32, top_k=4, n_routed_experts=n_experts)
    torch.manual_seed(0)
    moe = MoE(spec)
    moe.init_weights(0.02)
    if grouped_mm:
        moe.compute_experts = lambda rows, counts, weights: grouped_swiglu(
            rows, counts, moe.w1, moe.w3, moe.w2, grouped_mm=True, weights=weights)
    x = torch.randn(1, tokens, spec.hidden, requires_grad=True)
    loss = moe(x).square().sum()
    with ElementsWritten() as written:
        loss.backward()
    return written.elements


@pytest.mark.parametrize("grouped_mm", [False, True], ids=["loop", "grouped"])
def test_backward_work_grows_with_the_expert_weights_not_their_square(grouped_mm):
    """16 -> 128 experts at the same 512 tokens (top-4): the backward writes each expert
    weight's gradient a few times (the per-expert GEMMs' outputs, their one stack), and
    the router's [tokens, E] terms; so it grows by a few times the added weight elements.
    The per-expert select of the old loop wrote 290 elements per added weight element
    here (4.6 M -> 203 M elements, 44x for 8x the experts)."""
    weight = {E: 3 * E * 64 * 32 for E in (16, 128)}  # w1, w3, w2 elements
    written = {E: backward_elements(E, grouped_mm) for E in (16, 128)}
    grown = written[128] - written[16]
    assert grown < 4 * (weight[128] - weight[16]), (written, weight)
    assert written[128] < 3 * written[16], written


# ------------------------------------------------------------------ group padding


def test_pad_token_groups_by_hand():
    """Groups of 3, 0, 17 and 16 rows padded to multiples of 16: 16, 0, 32 and 16 rows,
    ending at 16, 16, 48, 64. Expert 0's rows go to 0-2, expert 2's (rows 3-19) to
    16-32, expert 3's (rows 20-35) to 48-63. The buffer has the static bound
    round_up(36 rows + 4 groups * 15, 16) = 96 rows: no shape depends on the routing."""
    dest, offs, rows = pad_token_groups(torch.tensor([3, 0, 17, 16]), 16, 36)
    assert offs.dtype == torch.int32
    assert offs.tolist() == [16, 16, 48, 64]
    assert dest.tolist() == [0, 1, 2, *range(16, 33), *range(48, 64)]
    assert rows == 96
    # MXFP8's 32: 32, 0, 32, 32.
    dest, offs, rows = pad_token_groups(torch.tensor([3, 0, 17, 16]), 32, 36)
    assert offs.tolist() == [32, 32, 64, 96]
    assert dest.tolist() == [0, 1, 2, *range(32, 49), *range(64, 80)]
    assert rows == 32 * -(-(36 + 4 * 31) // 32)
    # Groups already aligned stay where they are; no rows, no padding.
    dest, offs, _ = pad_token_groups(torch.tensor([16, 32]), 16, 48)
    assert dest.tolist() == list(range(48)) and offs.tolist() == [16, 48]
    dest, offs, rows = pad_token_groups(torch.tensor([0, 0]), 16, 0)
    assert dest.numel() == 0 and offs.tolist() == [0, 0] and rows == 0


def test_padded_grouped_gemm_equals_the_unpadded_one():
    """The grouped SwiGLU over groups padded with zero rows, the padding dropped again,
    is the unpadded computation, forward and gradients: a zero row changes no other row
    of a GEMM and adds nothing to a weight gradient (equal to fp32 rounding: the CPU
    GEMM blocks a group of 32 rows differently from one of 29)."""
    torch.manual_seed(2)
    E, d, f = 5, 32, 16
    weights = [torch.randn(E, f, d) * 0.1, torch.randn(E, f, d) * 0.1, torch.randn(E, d, f) * 0.1]
    counts = torch.tensor([7, 0, 16, 1, 29])
    x = torch.randn(int(counts.sum()), d)
    results = []
    for pad in (False, True):
        leaves = [w.clone().requires_grad_() for w in weights]
        xs = x.clone().requires_grad_()
        with OperatorNames() as ops:
            if pad:
                dest, offs, rows = pad_token_groups(counts, 16, xs.shape[0])
                padded = xs.new_zeros(rows, d).index_copy(0, dest, xs)
                out = moe_mod._grouped_swiglu(padded, offs, *leaves).index_select(0, dest)
            else:
                out = moe_mod._grouped_swiglu(xs, torch.cumsum(counts, 0, dtype=torch.int32),
                                              *leaves)
            out.square().sum().backward()
        # The padding adds no operator that makes a GPU wait for its host.
        assert not ops.names & SYNCING_OPS, ops.names
        results.append((out.detach(), xs.grad, *(w.grad for w in leaves)))
    for padded, plain in zip(*results):
        torch.testing.assert_close(padded, plain)


# ---------------------------------------------------------- no GPU sync, by operator

SYNCING_OPS = {"bincount", "nonzero", "masked_select", "_unique2", "unique_dim",
               "unique_consecutive", "_local_scalar_dense", "item", "repeat_interleave",
               "Tensor.tolist", "Tensor.item", "Tensor.__bool__", "Tensor.__int__",
               "Tensor.__float__"}
"""aten operators that make a CUDA device wait for the host: their output's size depends
on the values (bincount's largest id, nonzero's count, a boolean mask's, repeat_interleave
without output_size) or they read a value (_local_scalar_dense: .item(), .tolist())."""


class OperatorNames(TorchDispatchMode):
    """The aten operators run, and (through a TorchFunctionMode, since a CPU tensor's
    .tolist() reads its memory without an operator) the Python-level host reads."""

    def __init__(self):
        super().__init__()
        self.names: set[str] = set()
        outer = self

        class _Reads(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                name = getattr(func, "__name__", "")
                if name in ("tolist", "item", "__bool__", "__int__", "__float__"):
                    outer.names.add(f"Tensor.{name}")
                return func(*args, **(kwargs or {}))
        self._reads = _Reads()

    def __enter__(self):
        self._reads.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self._reads.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func._schema.name.removeprefix("aten::"))
        if func is torch.ops.aten.index.Tensor and any(
                t is not None and t.dtype == torch.bool for t in args[1]):
            self.names.add("index with a boolean mask")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("spec", [QWEN_TINY, get_model("pretrain_deepseek_v3", "tiny")],
                         ids=["qwen3", "deepseek_v3"])
def test_the_grouped_moe_layer_runs_no_operator_that_syncs_a_gpu(spec):
    """Forward and backward of an MoE layer (router, counts, sort, gather, the grouped
    GEMMs, combine, balance loss, DeepSeek-V3's bias load) with the grouped path forced,
    as a Hopper GPU runs it: no operator among those that make CUDA wait for the host.
    The counts are a scatter-add (CUDA's bincount reads its largest id on the host), the
    groups' offsets a cumsum on the device. The loop path's one read, its split sizes,
    is the control: the same watch sees it."""
    torch.manual_seed(0)
    moe = MoE(spec)
    moe.init_weights(0.02)
    moe.train()
    x = torch.randn(2, 16, spec.hidden, requires_grad=True)
    for grouped in (True, False):
        moe.compute_experts = lambda rows, counts, weights, g=grouped: grouped_swiglu(
            rows, counts, moe.w1, moe.w3, moe.w2, grouped_mm=g, weights=weights)
        with OperatorNames() as ops:
            moe(x).square().sum().backward()
        if grouped:
            assert "_grouped_mm" in ops.names
            assert not ops.names & (SYNCING_OPS | {"index with a boolean mask"}), ops.names
        else:
            assert "Tensor.tolist" in ops.names  # the loop's split sizes


def test_expert_counts_equal_bincount():
    ids = torch.tensor([[3, 1], [1, 0], [3, 3]])
    assert expert_counts(ids, 6).tolist() == torch.bincount(ids.flatten(), minlength=6).tolist()
