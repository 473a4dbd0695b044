"""The MoE layer's row movements and its experts' activation, written as autograd
functions that keep for the backward only what the backward reads.

Left to autograd, each of these keeps a whole [rows, hidden] (or [rows, ffn]) tensor it
never reads again: `index_copy` keeps its source, `index_add_` the weighted expert
outputs, and `silu(g) * u` keeps silu(g) beside g and u. Traced at Qwen3 235B-A22B's
width (`check`, 16,384 routed rows a microbatch), those were 0.4 GiB per MoE layer per
microbatch in flight. Their backwards need only the indices, the gate weights with the
expert outputs they scale, and the activation's two inputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class _ScatterRows(torch.autograd.Function):
    """x [n, d] placed at rows `dest` of a zero [rows, d]; the gradient gathers them back."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dest: torch.Tensor, rows: int) -> torch.Tensor:
        ctx.save_for_backward(dest)
        return x.new_zeros(rows, x.shape[1]).index_copy_(0, dest, x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (dest,) = ctx.saved_tensors
        return grad.index_select(0, dest), None, None


class _WeightedCombine(torch.autograd.Function):
    """sum over a token's rows of gate x expert output: out[t] = sum_{r: token_of[r] = t}
    gate[r] * expert_out[r], for `tokens` tokens. Keeps the expert outputs (the gate's
    gradient reads them), the gates and the indices; not their product."""

    @staticmethod
    def forward(ctx, expert_out: torch.Tensor, gate: torch.Tensor, token_of: torch.Tensor,
                tokens: int) -> torch.Tensor:
        ctx.save_for_backward(expert_out, gate, token_of)
        out = expert_out.new_zeros(tokens, expert_out.shape[1])
        return out.index_add_(0, token_of, expert_out * gate)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        expert_out, gate, token_of = ctx.saved_tensors
        per_row = grad.index_select(0, token_of)
        grad_gate = (per_row * expert_out).sum(-1, keepdim=True).to(gate.dtype)
        return per_row * gate, grad_gate, None, None


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up, keeping gate and up: silu runs again in the backward."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        return torch.ops.aten.silu_backward(grad * up, gate), grad * F.silu(gate)


def scatter_rows(x: torch.Tensor, dest: torch.Tensor, rows: int) -> torch.Tensor:
    return _ScatterRows.apply(x, dest, rows)


def weighted_combine(expert_out: torch.Tensor, gate: torch.Tensor, token_of: torch.Tensor,
                     tokens: int) -> torch.Tensor:
    return _WeightedCombine.apply(expert_out, gate, token_of, tokens)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return _SwiGLU.apply(gate, up)
