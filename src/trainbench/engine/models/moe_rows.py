"""The MoE layer's row movements, written as autograd functions that keep for the
backward only what the backward reads.

Left to autograd, each of these keeps a whole [rows, hidden] tensor it never reads
again: `index_copy` keeps its source, `index_add_` the weighted expert outputs. Their
backwards need only the indices and the gate weights with the expert outputs they scale.
(The experts' activation keeps only its two inputs through MoE.activate, which
parallel.keep_only_inputs_of_cheap_ops reruns in the backward like the dense MLP's.)
Traced at Qwen3 235B-A22B's width (`check`, 16,384 routed rows a microbatch), what the
three would otherwise keep is 0.4 GiB per MoE layer per microbatch in flight."""

from __future__ import annotations

import torch


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


def scatter_rows(x: torch.Tensor, dest: torch.Tensor, rows: int) -> torch.Tensor:
    return _ScatterRows.apply(x, dest, rows)


def weighted_combine(expert_out: torch.Tensor, gate: torch.Tensor, token_of: torch.Tensor,
                     tokens: int) -> torch.Tensor:
    return _WeightedCombine.apply(expert_out, gate, token_of, tokens)

