"""MoE routing under fake tensors: the balanced case, where routing decides a shape.

The engine's MoE is dropless, so how many rows each expert (and, under expert
parallelism, each rank) gets depends on the router's choices, which fake tensors do not
have. Two places read them: expert parallelism's dispatch reads the rows it sends to and
receives from each rank on the host (`counts.tolist()` in engine/parallel/ep.py: the
all-to-all's split sizes) and sizes the inbound rows' expert ids from them
(`repeat_interleave`), and the expert loop (the path without a grouped GEMM) reads each
expert's row count to split its rows (`_loop_swiglu` in engine/models/moe.py). Under a
plain FakeTensorMode each read raises DataDependentOutputException.

While tracing, each MoE layer's `compute_experts` runs inside `balanced_routing`, which
states the layer's row count N (its tokens times top_k, known from shapes), and the fake
mode below answers those reads as if the routing were balanced: a per-rank or per-expert
count vector of n entries holds N / n each (the remainder on the first entries), and the
inbound ids number N, as many rows as the rank sent. That is the load predict's engine
memory model assumes (predict/work.py `_moe_work`); the FP8 padding's static bound
(moe.py `pad_token_groups`) holds whatever the routing. An unbalanced step moves rows
between ranks and holds more on the busier ones. Everything else in the
layer (the router, the sort, the all-to-alls, the expert GEMMs, the combine) runs the
engine's own code on tensors of those shapes. A read outside an MoE layer's experts, or of
anything but such a count, still raises.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.weak import WeakIdKeyDictionary

from ..engine.models.moe import moe_layers

_aten = torch.ops.aten
_layer_rows: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "check_moe_layer_rows", default=None)


def balanced_shares(rows: int, n: int) -> list[int]:
    """`rows` split as evenly as possible over `n` ranks or experts, the remainder on the
    first."""
    return [rows // n + (1 if i < rows % n else 0) for i in range(n)]


def _is_count_vector(t: torch.Tensor) -> bool:
    return t.dim() == 1 and t.numel() > 0 and not (t.dtype.is_floating_point
                                                     or t.dtype.is_complex
                                                     or t.dtype == torch.bool)


class BalancedRoutingFakeMode(FakeTensorMode):
    """FakeTensorMode that answers an MoE layer's routing reads by the balanced case
    (module docstring); every other op is FakeTensorMode's own.

    A host read of a vector goes entry by entry (`tolist` unbinds it, then reads each
    0-d entry): an integer vector unbound inside a layer's experts has its entries'
    balanced values noted here, and their reads get them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._shares = WeakIdKeyDictionary()

    def dispatch(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rows = _layer_rows.get()
        if rows is not None:
            if func is _aten._local_scalar_dense.default and args[0] in self._shares:
                return self._shares[args[0]]
            if func is _aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
                kwargs = {**kwargs, "output_size": rows}
            if func is _aten.unbind.int and _is_count_vector(args[0]) and \
                    (args[1] if len(args) > 1 else kwargs.get("dim", 0)) == 0:
                entries = super().dispatch(func, types, args, kwargs)
                for entry, share in zip(entries, balanced_shares(rows, len(entries))):
                    self._shares[entry] = share
                return entries
        return super().dispatch(func, types, args, kwargs)


def _with_rows(compute):
    def compute_experts(rows: torch.Tensor, counts: torch.Tensor,
                        weights: torch.Tensor | None = None) -> torch.Tensor:
        token = _layer_rows.set(rows.shape[0])
        try:
            return compute(rows, counts, weights)
        finally:
            _layer_rows.reset(token)
    return compute_experts


@contextlib.contextmanager
def balanced_routing(parts):
    """Each MoE layer of `parts` computes its experts with its row count stated for
    BalancedRoutingFakeMode; the layers' own `compute_experts` (the model's, or expert
    parallelism's) are put back after."""
    layers = [moe for part in parts for moe in moe_layers(part)]
    saved = [(moe, moe.__dict__.get("compute_experts")) for moe in layers]
    for moe in layers:
        moe.compute_experts = _with_rows(moe.compute_experts)
    try:
        yield
    finally:
        for moe, own in saved:
            if own is None:
                del moe.compute_experts
            else:
                moe.compute_experts = own
