"""Cross-entropy over a large vocabulary without holding every token's fp32 logits.

At Llama 3's 128,256-token vocabulary and 8,192-token sequences, one sequence's logits
are 2.1 GB in bf16. The plain `F.cross_entropy(logits.float(), ...)` adds a 4.2 GB fp32
copy and keeps a 4.2 GB fp32 log-softmax for the backward, and the backward makes a
4.2 GB fp32 gradient: about 12 GB at the peak for one microbatch, more than the whole
4-layer proxy's weights and optimizer state.

Here the tokens are cut into chunks; each chunk's logits are upcast to fp32 only inside
the chunk's loss, which is checkpointed, so the forward keeps nothing of a chunk but its
(bf16) input and the backward recomputes one chunk's fp32 softmax at a time. The sum of
the chunks' summed losses over the token count is the same mean as the plain loss.

Under tensor parallelism the logits are a DTensor sharded over the vocabulary and the
loss runs inside `loss_parallel`, which never gathers them: the chunks are cut the same
way, along the tokens, each holding its 1/TP of the vocabulary, and the budget counts
those local logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

CHUNK_ELEMENTS = 2 ** 27
"""fp32 logits held by one chunk at a time (512 MiB): 1,046 tokens at a 128k vocabulary,
so a 8k-token microbatch takes 8 chunks; a tiny model's microbatch fits in one."""


def chunk_tokens(vocab: int, budget: int | None = None) -> int:
    """Tokens per chunk so that a chunk's fp32 logits stay within `budget` elements
    (CHUNK_ELEMENTS, read at each call, when None)."""
    return max(1, (budget or CHUNK_ELEMENTS) // max(1, vocab))


def _chunk_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels, reduction="sum")


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor,
                  tokens_per_chunk: int | None = None) -> torch.Tensor:
    """Mean cross-entropy (fp32) of logits [..., vocab] against labels [...].

    `tokens_per_chunk` None picks chunk_tokens(local vocabulary). One chunk (a small
    model) runs the plain loss: checkpointing it would only add a recomputation.
    """
    flat, targets = logits.flatten(0, -2), labels.flatten()
    # A DTensor (under loss_parallel) holds 1/TP of the vocabulary on this rank.
    local = flat.to_local() if hasattr(flat, "to_local") else flat
    per_chunk = tokens_per_chunk or chunk_tokens(local.shape[-1])
    if flat.shape[0] <= per_chunk:
        return F.cross_entropy(flat.float(), targets)
    total = None
    for part, part_labels in zip(flat.split(per_chunk), targets.split(per_chunk)):
        part_sum = checkpoint(_chunk_loss_sum, part, part_labels, use_reentrant=False)
        total = part_sum if total is None else total + part_sum
    return total / targets.numel()


def describe(vocab: int, tokens_per_microbatch: int, tensor_parallel: bool) -> str:
    """The loss as run.json records it; `vocab` is this rank's share of the vocabulary."""
    kind = "vocab-parallel cross-entropy (loss_parallel, logits sharded over TP)" \
        if tensor_parallel else "cross-entropy"
    per = chunk_tokens(vocab)
    if tokens_per_microbatch <= per:
        return f"{kind}, fp32 logits (one chunk)"
    return (f"chunked {kind}: {-(-tokens_per_microbatch // per)} checkpointed chunks "
            f"of {per} tokens, fp32 inside each")
