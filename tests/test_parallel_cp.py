"""Context parallelism's pieces: the head-tail split, and the all-gather attention against
full causal attention, forward and backward, on two real gloo processes."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from helpers import leave_spawned_rank
from trainbench.engine.parallel.cp import chunk_ids, local_positions, shard_sequence

# fp32: the CP result differs from full attention only in summation order.
ATOL = 1e-5


def test_head_tail_split_covers_the_sequence_once():
    seq, cp = 24, 3
    tokens = torch.arange(seq).expand(2, -1)
    held = []
    for rank in range(cp):
        shard = shard_sequence(tokens, cp, rank)
        assert torch.equal(shard[0], local_positions(seq, cp, rank))
        assert torch.equal(shard[0], shard[1])
        held += shard[0].tolist()
    assert sorted(held) == list(range(seq))
    assert chunk_ids(cp, 0) == (0, 5) and chunk_ids(cp, 2) == (2, 3)
    # Causal work is balanced: every rank's queries see the same number of keys.
    work = [int((local_positions(seq, cp, r) + 1).sum()) for r in range(cp)]
    assert len(set(work)) == 1
    with pytest.raises(ValueError):
        shard_sequence(torch.zeros(1, 10), 3, 0)


def _attention_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    from trainbench.engine.parallel.cp import context_parallel_attention
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    gen = torch.Generator().manual_seed(0)  # the same full tensors on every rank
    b, heads, kv_heads, seq, dim = 2, 4, 2, 16, 8
    q = torch.randn(b, heads, seq, dim, generator=gen)
    k = torch.randn(b, kv_heads, seq, dim, generator=gen)
    v = torch.randn(b, kv_heads, seq, dim, generator=gen)
    weight = torch.randn(b, heads, seq, dim, generator=gen)  # a loss that weighs every output

    for keep_shard in (False, True):
        # keep_shard: the backward gathers the keys and values again (the engine's default
        # without recompute); the same outputs and gradients either way.
        local = [shard_sequence(t, world, rank, dim=2).requires_grad_() for t in (q, k, v)]
        out = context_parallel_attention(*local, dist.group.WORLD, keep_shard=keep_shard)
        (out * shard_sequence(weight, world, rank, dim=2)).sum().backward()
        torch.save({"out": out.detach(), "grads": [t.grad for t in local]},
                   os.path.join(out_dir, f"rank{rank}{'-shard' if keep_shard else ''}.pt"))
    dist.destroy_process_group()
    leave_spawned_rank()


@pytest.mark.dist
def test_all_gather_attention_matches_full_causal_attention_and_its_gradients(tmp_path):
    world = 2
    torch.multiprocessing.spawn(_attention_worker, args=(world, str(tmp_path / "init"),
                                                         str(tmp_path)), nprocs=world)
    gen = torch.Generator().manual_seed(0)
    b, heads, kv_heads, seq, dim = 2, 4, 2, 16, 8
    q = torch.randn(b, heads, seq, dim, generator=gen).requires_grad_()
    k = torch.randn(b, kv_heads, seq, dim, generator=gen).requires_grad_()
    v = torch.randn(b, kv_heads, seq, dim, generator=gen).requires_grad_()
    weight = torch.randn(b, heads, seq, dim, generator=gen)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    (ref * weight).sum().backward()
    for rank, kept in [(r, k) for r in range(world) for k in ("", "-shard")]:
        got = torch.load(tmp_path / f"rank{rank}{kept}.pt")
        torch.testing.assert_close(got["out"], shard_sequence(ref.detach(), world, rank, dim=2),
                                   atol=ATOL, rtol=0)
        # k and v gradients gather what every rank's queries sent back (reduce-scatter).
        for name, full, grad in zip("qkv", (q, k, v), got["grads"]):
            torch.testing.assert_close(grad, shard_sequence(full.grad, world, rank, dim=2),
                                       atol=ATOL, rtol=0, msg=f"d{name} on cp rank {rank}")
