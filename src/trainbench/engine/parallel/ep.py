"""Expert parallelism: each of the `ep` ranks of an expert group holds E/ep routed experts.

EP spans a stage's tensor, context and data ranks, in that order (Megatron-Core's layout
with expert tensor parallelism 1; mesh.py): an expert group is ep neighbouring ranks. Every
rank routes its own tokens (under TP its sequence shard: tp.MoETokenLocal), sends each
token slot to the rank that holds its expert (`all_to_all_single`, dropless: the split
sizes are exchanged first, then the rows), computes its local experts with the same
grouped path as one process, and sends the results back (the reverse all-to-all). The
autograd Function below runs the reverse exchange in backward, so gradients follow
the tokens home.

Parameters: the router and shared expert are FSDP-sharded over the data and context
ranks (and the tensor ranks under TP, where they are token-local). The routed experts
are DTensors sharded on dim 0 over `ep`, then FSDP-sharded over the ranks that hold the
same experts (`dp_mod_ep`, dp*cp*tp/ep of them). Their gradient on a rank already sums
the contributions of the ep ranks whose tokens it served, and FSDP's reduce-scatter over
dp_mod_ep divides by dp*cp*tp/ep only: the expert weights' gradient is scaled by 1/ep on
its way in (`_ScaleGrad`); with TP's factor tp on the layer's output gradient
(tp.MoETokenLocal) that makes it the same mean over dp x cp as every other parameter's.
(FSDP's own divide factor would do the same but needs ReduceOp.PREMUL_SUM, which gloo
lacks.)

The model code only offers the hooks: `MoE.compute_experts(rows, counts, weights)`, replaced here
per layer, as context parallelism replaces `attend`, and `MoE.sequence_counts`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard

from trainbench.engine.models.moe import grouped_swiglu, moe_layers

EXPERT_WEIGHTS = ("w1", "w3", "w2")


def _exchange(x: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
    out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv,
                           input_split_sizes=send, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """Each of the row tensors xs goes out in `send` sized blocks (one per rank of
    `group`) and comes in as `recv` sized blocks; backward sends their gradients back
    along the same routes. One function for all of them: its backward runs their
    exchanges together, in one order on every rank, where separate functions' backwards
    could be reached in different orders on ranks whose graphs differ (one that got no
    rows) and wait on each other."""

    @staticmethod
    def forward(ctx, send: list[int], recv: list[int], group, *xs: torch.Tensor):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return tuple(_exchange(x, send, recv, group) for x in xs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        return (None, None, None) + tuple(_exchange(g, ctx.recv, ctx.send, ctx.group)
                                          for g in grads)


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return w.view_as(w)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


def scale_grad(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x, whose gradient is multiplied by `scale` on its way back."""
    return _ScaleGrad.apply(x, scale)


def all_to_all(xs: tuple[torch.Tensor, ...], send: list[int], recv: list[int],
               group) -> tuple[torch.Tensor, ...]:
    return _AllToAll.apply(send, recv, group, *xs)


def dispatch_compute_combine(rows: torch.Tensor, counts: torch.Tensor, experts, group,
                             ep: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Rows [N, d] sorted by global expert id (counts [E] per expert) -> expert outputs
    [N, d] in the same order, the experts living on the ep ranks of `group` (rank r holds
    experts r*E/ep ... (r+1)*E/ep - 1). `experts(rows, local_counts, weights)` computes
    this rank's experts on rows sorted by local expert; the rows' gate weights [N, 1]
    (or None) travel with them, as Megatron's dispatcher sends the permuted probs."""
    n_local = counts.numel() // ep
    # Rows for rank r are contiguous: they are sorted by expert and r's experts are a block.
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts.contiguous(), group=group)
    per_source = received.view(ep, n_local)  # [source rank, local expert]
    send = counts.view(ep, n_local).sum(1).tolist()
    recv = per_source.sum(1).tolist()
    outbound = (rows,) if weights is None else (rows, weights)
    inbound = all_to_all(outbound, send, recv, group)
    # Inbound rows come grouped by source, then by expert: regroup them by expert.
    local_expert = torch.repeat_interleave(
        torch.arange(n_local, device=rows.device).repeat(ep), per_source.flatten())
    order = torch.argsort(local_expert, stable=True)
    out = experts(inbound[0][order], per_source.sum(0),
                  inbound[1][order] if weights is not None else None)
    out = out[torch.argsort(order)]
    return all_to_all((out,), recv, send, group)[0]


def _local(w: torch.Tensor) -> torch.Tensor:
    return w.to_local() if isinstance(w, DTensor) else w


def _ep_compute(moe: nn.Module, group, ep: int):
    def experts(rows: torch.Tensor, counts: torch.Tensor,
                weights: torch.Tensor | None) -> torch.Tensor:
        w1, w3, w2 = (scale_grad(_local(getattr(moe, n)), 1.0 / ep) for n in EXPERT_WEIGHTS)
        out = grouped_swiglu(rows, counts, w1, w3, w2, activate=moe.activate, weights=weights)
        if rows.shape[0] == 0:
            # No token for any local expert. A zero term still gives the weights a
            # gradient, so every rank joins the same gradient reduce-scatters; and it
            # keeps the output a function of the (empty) inbound rows, so a backward to
            # the inputs only (pipeline stages infer their gradient shapes that way)
            # still runs both all-to-alls' backward here, as the ranks that did get
            # rows do. Without `rows`, such a rank skipped them and its peer hung.
            # The gate weights came through the rows' all-to-all function, whose backward
            # exchanges both.
            out = out + 0 * (w1.sum() + w3.sum() + w2.sum() + rows.sum())
        return out

    def compute_experts(rows: torch.Tensor, counts: torch.Tensor,
                        weights: torch.Tensor | None = None) -> torch.Tensor:
        return dispatch_compute_combine(rows, counts, experts, group, ep, weights)
    return compute_experts


def apply_expert_parallel(model: nn.Module, ep_mesh) -> None:
    """Shard every MoE layer's routed experts over `ep_mesh` and route tokens to them."""
    ep, group = ep_mesh.size(), ep_mesh.get_group()
    for moe in moe_layers(model):
        if moe.n_experts % ep:
            raise ValueError(f"{moe.n_experts} routed experts do not split over ep={ep}")
        for name in EXPERT_WEIGHTS:
            w = getattr(moe, name)
            mine = w.data.chunk(ep)[ep_mesh.get_local_rank()]
            setattr(moe, name, nn.Parameter(DTensor.from_local(mine, ep_mesh, [Shard(0)],
                                                               run_check=False)))
        moe.compute_experts = _ep_compute(moe, group, ep)


def share_sequence_counts(model: nn.Module, group) -> None:
    """The MoE balance losses count each expert's tokens over whole sequences, which the
    ranks of `group` (context ranks, and tensor ranks where the layer is token-local)
    hold in parts: each rank's counts are summed over them (`MoE.sequence_counts`)."""
    def sequence_counts(counts: torch.Tensor) -> torch.Tensor:
        total = counts.clone()  # counts carry no gradient: a plain all-reduce
        dist.all_reduce(total, group=group)
        return total
    for moe in moe_layers(model):
        moe.sequence_counts = sequence_counts


def share_expert_load(model: nn.Module, group) -> None:
    """Sum the expert load that moves DeepSeek-V3's selection bias over `group` (every rank
    that routes different tokens: data, context, and token-local tensor ranks) before
    each update: every rank then moves its bias by the load of the whole batch, so the
    ranks keep one bias, as one process would, instead of each drifting with its own
    tokens."""
    for moe in moe_layers(model):
        if moe.spec.bias_update_speed:
            moe.update_bias = _global_load_update(moe, group)


def _global_load_update(moe: nn.Module, group):
    local_update = moe.update_bias

    @torch.no_grad()
    def update_bias() -> None:
        dist.all_reduce(moe.expert_load, group=group)
        local_update()
    return update_bias


def fully_shard_experts(model: nn.Module, dense_mesh, expert_dp_mesh, policy,
                        reshard_after_forward: bool) -> None:
    """FSDP units for the MoE layers, before their blocks': the router and shared expert
    on `dense_mesh` (the data and context ranks, and the tensor ranks under TP), the
    routed experts (ep-sharded where EP is on) on `expert_dp_mesh`."""
    for moe in moe_layers(model):
        for sub in (moe.router, moe.shared):
            if sub is not None:
                fully_shard(sub, mesh=dense_mesh, mp_policy=policy,
                            reshard_after_forward=reshard_after_forward)
        fully_shard(moe, mesh=expert_dp_mesh, mp_policy=policy,
                    reshard_after_forward=reshard_after_forward)
