"""The MoE layer's row movements, written as autograd functions that keep for the
backward only what the backward reads.

Left to autograd, `index_copy` keeps its source, a whole [rows, hidden] tensor it never
reads again; both backwards need only the indices. (The gate weights scale each row
inside the experts' activation, MoE.activate, which keeps only its inputs and is rerun
in the backward like the dense MLP's: the combine below is a plain sum and keeps no
expert output for the weights' gradient.) Traced at Qwen3 235B-A22B's width (`check`,
16,384 routed rows a microbatch), the source and the expert outputs were 0.4 GiB per
MoE layer per microbatch in flight."""

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


class _CombineRows(torch.autograd.Function):
    """The sum over a token's rows: out[t] = sum_{r: token_of[r] = t} rows[r], for `tokens`
    tokens. Keeps only the indices."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, token_of: torch.Tensor, tokens: int) -> torch.Tensor:
        ctx.save_for_backward(token_of)
        return rows.new_zeros(tokens, rows.shape[1]).index_add_(0, token_of, rows)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (token_of,) = ctx.saved_tensors
        return grad.index_select(0, token_of), None, None


def scatter_rows(x: torch.Tensor, dest: torch.Tensor, rows: int) -> torch.Tensor:
    return _ScatterRows.apply(x, dest, rows)


def combine_rows(rows: torch.Tensor, token_of: torch.Tensor, tokens: int) -> torch.Tensor:
    return _CombineRows.apply(rows, token_of, tokens)

