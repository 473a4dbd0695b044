"""The engine's kernel choices for large vocabularies and GPUs (issue 19, item 3), checked
for numerics on the CPU: the chunked cross-entropy, the AdamW implementation and the SDPA
backend recorded in run.json."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainbench.engine.loss import CHUNK_ELEMENTS, chunk_tokens, cross_entropy


def _saved_for_backward(fn):
    """fn's result and the (shape, dtype) of every tensor its graph keeps for backward."""
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, saved


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("per_chunk", [1, 7, 16, 74])
def test_chunked_loss_and_gradients_equal_the_plain_loss(dtype, per_chunk):
    """2 x 37 tokens over a 50-word vocabulary, in chunks that do and do not divide it."""
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 37, 50, generator=gen) * 3).to(dtype)
    labels = torch.randint(0, 50, (2, 37), generator=gen)
    plain_in = logits.clone().requires_grad_()
    chunk_in = logits.clone().requires_grad_()
    plain = F.cross_entropy(plain_in.float().flatten(0, 1), labels.flatten())
    chunked = cross_entropy(chunk_in, labels, tokens_per_chunk=per_chunk)
    assert chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, plain, rtol=1e-6, atol=1e-6)
    plain.backward()
    chunked.backward()
    # Gradients come back in the logits' dtype: bf16 rounding of equal fp32 values.
    tol = dict(rtol=1.6e-2, atol=1e-5) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(chunk_in.grad, plain_in.grad, **tol)


def test_the_backward_keeps_no_full_fp32_logits():
    """The plain loss keeps [tokens, vocab] fp32 tensors for its backward; the chunked one
    keeps only the bf16 logits of each chunk (its checkpoint's input), nothing in fp32."""
    logits = torch.randn(4, 64, 96, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 96, (4, 64))
    _, plain = _saved_for_backward(
        lambda: F.cross_entropy(logits.float().flatten(0, 1), labels.flatten()))
    assert ((256, 96), torch.float32) in plain
    _, chunked = _saved_for_backward(lambda: cross_entropy(logits, labels, tokens_per_chunk=32))
    assert chunked and all(dt != torch.float32 for shape, dt in chunked if len(shape) == 2)
    assert max(shape[0] for shape, _ in chunked) == 32


def test_chunk_size_follows_the_vocabulary():
    """Llama 3's 128,256 words: a chunk's fp32 logits stay within the budget, so an 8k-token
    microbatch runs in 8 chunks; the tiny models (512 words) need only one."""
    per = chunk_tokens(128256)
    assert per * 128256 <= CHUNK_ELEMENTS < (per + 1) * 128256
    assert -(-8192 // per) == 8
    assert chunk_tokens(512) >= 4 * 128  # the tiny rows' MBS x seq: one chunk, plain loss
