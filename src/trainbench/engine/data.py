"""Synthetic token batches, deterministic per seed and global sample index.

A sample depends only on (seed, step, index in the global batch), never on the layout,
so one process and any parallel layout train on exactly the same tokens: the basis of
every parity test. The default task is learnable (each sequence is an arithmetic
progression modulo the vocabulary, with its own start and stride), so a falling loss
shows that the model really trains; `uniform` gives the seeds' pure random tokens.
"""

from __future__ import annotations

import torch

# Strides are drawn from a small set so that the model can infer one from the context.
_STRIDES = 7


def sample_tokens(seed: int, step: int, index: int, seq_len: int, vocab: int,
                  kind: str = "arithmetic") -> torch.Tensor:
    """One sequence of seq_len + 1 tokens (inputs and shifted labels)."""
    gen = torch.Generator().manual_seed(hash((seed, step, index)) & 0x7FFF_FFFF_FFFF_FFFF)
    if kind == "uniform":
        return torch.randint(0, vocab, (seq_len + 1,), generator=gen)
    start = int(torch.randint(0, vocab, (1,), generator=gen))
    stride = 1 + int(torch.randint(0, _STRIDES, (1,), generator=gen))
    return (start + stride * torch.arange(seq_len + 1)) % vocab


def microbatch(seed: int, step: int, first_index: int, mbs: int, seq_len: int, vocab: int,
               kind: str = "arithmetic") -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and labels [mbs, seq_len] for global samples first_index..first_index+mbs-1."""
    rows = torch.stack([sample_tokens(seed, step, first_index + i, seq_len, vocab, kind)
                        for i in range(mbs)])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def rank_sample_range(gbs: int, dp: int, dp_rank: int) -> range:
    """The global sample indices one data-parallel rank trains on in a step."""
    per_rank = gbs // dp
    return range(dp_rank * per_rank, (dp_rank + 1) * per_rank)
