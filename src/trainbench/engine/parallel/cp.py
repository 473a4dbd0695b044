"""Context parallelism: each rank of the cp group holds a part of every sequence.

The all-gather form (Llama 3's training used it): queries stay local, keys and values
are gathered from the whole cp group before attention. It needs only an all-gather
forward and a reduce-scatter backward, so it runs on gloo (CPU) and NCCL alike, unlike
PyTorch's ring-attention `context_parallel`, which needs the CUDA attention kernels.

Load balance: the sequence is cut into 2*CP equal chunks and cp rank r keeps chunks r
and 2*CP-1-r (head and tail). Under a causal mask late chunks attend to more keys than
early ones; pairing an early with a late chunk gives every rank the same work.

The model needs only two things, both seams it already has: the tokens' true
positions (for RoPE), passed by the trainer, and a replacement for each attention
module's `attend(q, k, v)`, installed by `apply_context_parallel`.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard
from torch.nn.attention.bias import causal_lower_right

from .tp import regathered_in_backward


def chunk_ids(cp: int, rank: int) -> tuple[int, int]:
    """The two sequence chunks (of 2*cp) that cp rank `rank` holds: head and tail."""
    return rank, 2 * cp - 1 - rank


def local_positions(seq_len: int, cp: int, rank: int, device=None) -> torch.Tensor:
    """Positions in the full sequence of the tokens cp rank `rank` holds, in its order."""
    chunk = seq_len // (2 * cp)
    return torch.cat([torch.arange(c * chunk, (c + 1) * chunk, device=device)
                      for c in chunk_ids(cp, rank)])


def shard_sequence(t: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """This cp rank's part of `t` along the sequence dim `dim` (head chunk, tail chunk)."""
    chunks = t.chunk(2 * cp, dim=dim)
    if len(chunks) != 2 * cp or t.shape[dim] % (2 * cp):
        raise ValueError(f"sequence of {t.shape[dim]} tokens does not split into 2*CP = "
                         f"{2 * cp} equal chunks")
    head, tail = chunk_ids(cp, rank)
    return torch.cat([chunks[head], chunks[tail]], dim=dim)


# PyTorch 2.13 renamed the tensor forms of the two collectives; older releases have only
# the old names.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _GatherSequence(torch.autograd.Function):
    """All-gather along the sequence dim (2) of [b, heads, s, d]; backward reduce-scatters.

    Every rank's queries read every rank's keys, so the gradient of rank j's keys is the
    sum of what all ranks' attention sends back to them: a sum reduce-scatter.
    """

    @staticmethod
    def forward(ctx, local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        world = dist.get_world_size(group)
        # Collectives concatenate along dim 0: move the sequence to the front.
        front = local.movedim(2, 0).contiguous()
        out = front.new_empty((world * front.shape[0], *front.shape[1:]))
        _all_gather(out, front, group=group)
        return out.movedim(0, 2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        world = dist.get_world_size(ctx.group)
        front = grad.movedim(2, 0).contiguous()
        out = front.new_empty((front.shape[0] // world, *front.shape[1:]))
        _reduce_scatter(out, front, op=dist.ReduceOp.SUM, group=ctx.group)
        return out.movedim(0, 2), None


def gather_sequence(local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """[b, h, s_local, d] from each cp rank -> [b, h, cp*s_local, d], rank-major order."""
    return _GatherSequence.apply(local, group)


def context_parallel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               group: dist.ProcessGroup, scale: float | None = None,
                               keep_shard: bool = False) -> torch.Tensor:
    """Causal attention of this rank's queries over the keys/values of the whole sequence.

    q [b, heads, s_local, d], k and v [b, kv_heads, s_local, d], all in this rank's
    (head chunk, tail chunk) order. The gathered keys are put back in sequence order;
    then each local chunk c of L queries attends to the first (c+1)*L keys under a
    bottom-right-aligned causal mask: query i of chunk c (position c*L + i) sees keys
    0..c*L + i. Keys past the chunk are never computed, and `causal_lower_right` keeps
    the fused (flash / memory-efficient) kernels eligible, unlike a boolean mask.
    `scale` is the softmax scale (None: 1/sqrt(head dim), SDPA's default).

    `keep_shard`: the attention kernels' saved keys and values (the whole sequence's,
    grouped heads expanded) are not kept for the backward; it gathers them again from
    this rank's k and v (tp.regathered_in_backward), so the backward holds only the
    rank's own K/V shard between forward and backward, as Megatron's ring attention
    does. Losses and gradients are the same (the same values are read again).
    """
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    chunk = q.shape[2] // 2
    heads = q.shape[1]
    k_all, v_all = _whole_keys_values(k, v, group, cp, chunk, heads)
    saved = contextlib.nullcontext()
    if keep_shard and torch.is_grad_enabled():
        k_mine, v_mine = k.detach(), v.detach()
        saved = regathered_in_backward(
            (k_all, v_all), lambda: _whole_keys_values(k_mine, v_mine, group, cp, chunk, heads))
    outputs = []
    with saved:
        for local, c in enumerate(chunk_ids(cp, rank)):
            q_c = q[:, :, local * chunk:(local + 1) * chunk]
            keys = (c + 1) * chunk
            mask = (dict(is_causal=True) if MEMORY_TRACE_STANDIN
                    else dict(attn_mask=_lower_right(chunk, keys)))
            outputs.append(F.scaled_dot_product_attention(
                q_c, k_all[:, :, :keys], v_all[:, :, :keys], scale=scale, **mask))
    return torch.cat(outputs, dim=2)


def _whole_keys_values(k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup, cp: int,
                       chunk: int, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole sequence's keys and values in sequence order, grouped heads expanded to
    the query heads."""
    if k.shape[-1] == v.shape[-1]:
        # One collective for both: stack k and v along the batch dim.
        k_all, v_all = _in_sequence_order(gather_sequence(torch.cat([k, v]), group),
                                          cp, chunk).chunk(2)
    else:  # MLA: keys carry the RoPE dims, values do not
        k_all, v_all = (_in_sequence_order(gather_sequence(t, group), cp, chunk)
                        for t in (k, v))
    if k_all.shape[1] != heads:
        # Expand grouped KV heads here rather than with enable_gqa, which the attention
        # bias path does not take.
        repeat = heads // k_all.shape[1]
        k_all = k_all.repeat_interleave(repeat, dim=1)
        v_all = v_all.repeat_interleave(repeat, dim=1)
    return k_all, v_all


MEMORY_TRACE_STANDIN = False
"""Set only by `trainbench check --trace` (check/build.py): the lower-right causal bias is
a tensor subclass that cannot wrap a FakeTensor, so a memory trace gives each chunk's
attention the top-left causal mask instead. The numbers differ; what the step keeps does
not: the same inputs, and a fused kernel's output and softmax statistics of the same
shapes."""


def _in_sequence_order(gathered: torch.Tensor, cp: int, chunk: int) -> torch.Tensor:
    """Rank-major chunks (head_j, tail_j for each rank j) -> the sequence's order."""
    pieces = gathered.split(chunk, dim=2)
    order = [None] * (2 * cp)
    for j in range(cp):
        head, tail = chunk_ids(cp, j)
        order[head], order[tail] = pieces[2 * j], pieces[2 * j + 1]
    return torch.cat(order, dim=2)


@functools.lru_cache(maxsize=64)
def _lower_right(queries: int, keys: int):
    """The lower-right causal bias, made once per shape: it holds no data, and every layer
    of every step uses the same two."""
    return causal_lower_right(queries, keys)


def apply_context_parallel(model: nn.Module, cp_mesh: DeviceMesh, impl: str = "allgather",
                           keep_shard: bool = True) -> None:
    """Swap the attention core of every module with an `attend` method for the CP one.

    Works for any family whose attention goes through `attend(q, k, v)`; the trainer
    shards inputs, labels and positions with `shard_sequence` / `local_positions`.
    `impl` "ring" uses PyTorch's ring attention instead of the all-gather form.
    `keep_shard` (the all-gather form): the backward gathers the keys and values again
    instead of keeping the whole sequence's (context_parallel_attention); set it only
    where no checkpoint recomputes the attention core (keeps_shard).
    """
    group = cp_mesh.get_group()
    if impl == "ring":
        # A private torch function: imported where it is used, so a torch release that
        # moved it fails only a CP layout, not every import of this module.
        from torch.distributed.tensor.experimental._attention import (
            _enable_context_parallel_dispatcher)
        _enable_context_parallel_dispatcher()
    # A pipeline stage may hold no attention at all (only the embedding or the loss).
    for module in model.modules():
        if callable(getattr(module, "attend", None)):
            # MLA (DeepSeek-V3) scales its scores by its own softmax scale.
            scale = getattr(module, "softmax_scale", None)
            module.attend = (_ring_attend(cp_mesh, scale) if impl == "ring"
                             else _bound_attend(group, scale, keep_shard))


def _ring_attend(cp_mesh: DeviceMesh, scale: float | None = None):
    """PyTorch's ring attention (`context_parallel`'s SDPA dispatch) on this rank's
    shard. Its head-tail load balancer holds the same chunks as `shard_sequence`
    (chunks r and 2*CP-1-r), so the trainer's sharding serves both forms. It dispatches
    only the CUDA kernels (flash, memory-efficient, cuDNN): plan validation refuses it on
    a CPU."""
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if k.shape[1] != q.shape[1]:
            # The ring kernels take no enable_gqa: expand grouped KV heads here.
            repeat = q.shape[1] // k.shape[1]
            k = k.repeat_interleave(repeat, dim=1)
            v = v.repeat_interleave(repeat, dim=1)
        q, k, v = (DTensor.from_local(t.contiguous(), cp_mesh, [Shard(2)], run_check=False)
                   for t in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              scale=scale).to_local()
    return attend


def _bound_attend(group: dist.ProcessGroup, scale: float | None = None,
                  keep_shard: bool = False):
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return context_parallel_attention(q, k, v, group, scale, keep_shard)
    return attend


def keeps_shard(plan) -> bool:
    """Whether the all-gather CP keeps only the rank's keys and values for the backward:
    where nothing recomputes the attention core (recompute 'none'). Selective recompute
    keeps only the core's inputs (this rank's q, k, v) and gathers again when it reruns
    it; full recompute keeps only the block's input."""
    return plan.recompute == "none"
