"""The engine's kernel choices for large vocabularies and GPUs (issue 19, item 3), checked
for numerics on the CPU: the chunked cross-entropy, the AdamW implementation and the SDPA
backend (run.json's record of them: tests/test_host_sync.py, whose one-rank trainer it
needs)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import leave_spawned_rank
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


def _vocab_parallel_ranks(rank: int, port: int, out_dir: str) -> None:
    """One of two gloo ranks: the same logits as a DTensor sharded over the vocabulary,
    loss and gradient under loss_parallel, plain and in chunks of 5 tokens."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        gen = torch.Generator().manual_seed(0)
        logits = torch.randn(2, 19, 50, generator=gen) * 3
        labels = torch.randint(0, 50, (2, 19), generator=gen)
        results = {}
        for name, per_chunk in (("plain", 10 ** 6), ("chunked", 5)):
            sharded = distribute_tensor(logits, mesh, [Shard(2)]).requires_grad_()
            with loss_parallel():
                loss, saved = _saved_for_backward(
                    lambda: cross_entropy(sharded, labels, tokens_per_chunk=per_chunk))
                loss.backward()
            results[name] = (loss.full_tensor(), sharded.grad.full_tensor(), saved)
        torch.save(results, f"{out_dir}/rank{rank}.pt")
        # Both ranks done before either tears gloo down: a rank that destroys its group
        # while its peer still talks to it aborted the process about once in six runs
        # ("terminate called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()
    leave_spawned_rank()


def test_chunked_vocab_parallel_loss_equals_the_plain_loss_on_two_ranks(tmp_path):
    """Under TP the logits stay sharded over the vocabulary (loss_parallel) and the chunks
    are cut along the tokens: 38 tokens in chunks of 5 give one process's loss and
    gradient on both ranks (fp32: summation order only)."""
    import socket

    import torch.multiprocessing as mp
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_vocab_parallel_ranks, args=(port, str(tmp_path)), nprocs=2, join=True)
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 19, 50, generator=gen) * 3).requires_grad_()
    labels = torch.randint(0, 50, (2, 19), generator=gen)
    reference = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    reference.backward()
    for rank in (0, 1):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        for loss, grad, _ in results.values():
            torch.testing.assert_close(loss, reference.detach(), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(grad, logits.grad, rtol=1e-5, atol=1e-7)
        # The plain loss keeps tensors of every token's logits for its backward; the
        # chunked one only its chunks' (its checkpoints keep their inputs, 5 tokens each).
        rows = {name: [shape[0] for shape, _ in saved if len(shape) == 2]
                for name, (_, _, saved) in results.items()}
        assert 38 in rows["plain"]
        assert rows["chunked"] and max(rows["chunked"]) == 5


def test_chunk_size_follows_the_vocabulary():
    """Llama 3's 128,256 words: a chunk's fp32 logits stay within the budget, so an 8k-token
    microbatch runs in 8 chunks; the tiny models (512 words) need only one."""
    per = chunk_tokens(128256)
    assert per * 128256 <= CHUNK_ELEMENTS < (per + 1) * 128256
    assert -(-8192 // per) == 8
    assert chunk_tokens(512) >= 4 * 128  # the tiny rows' MBS x seq: one chunk, plain loss


# --- AdamW: fused on CUDA, foreach elsewhere ---------------------------------------------

def _tiny_model(device: str) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    for module in model:
        for name, param in list(module.named_parameters(recurse=False)):
            setattr(module, name, torch.nn.Parameter(torch.randn_like(param, device=device)))
    return model


def test_adamw_is_fused_when_the_parameters_are_on_cuda():
    """No GPU here: fake CUDA parameters (FakeTensorMode) reach the same constructor."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trainbench.engine.optim import build_optimizer, describe
    with FakeTensorMode():
        model = _tiny_model("cuda")
        assert next(model.parameters()).device.type == "cuda"
        opt = build_optimizer(model, 1e-3)
    assert opt.defaults["fused"] is True and not opt.defaults["foreach"]
    assert describe(opt)["implementation"] == "fused"


def test_adamw_is_foreach_on_the_cpu_and_trains():
    from trainbench.engine.optim import build_optimizer, describe
    model = _tiny_model("cpu")
    opt = build_optimizer(model, 1e-2)
    info = describe(opt)
    assert info["implementation"] == "foreach" and not opt.defaults["fused"]
    # Weight decay: the Linear weight decays, its bias and the norm's parameters do not.
    assert info["weight_decay"] == [0.1, 0.0] and len(opt.param_groups[0]["params"]) == 1
    before = model[0].weight.detach().clone()
    model(torch.ones(2, 8)).square().sum().backward()
    opt.step()
    assert not torch.equal(model[0].weight, before)


# --- SDPA backend and the record in run.json ---------------------------------------------

def test_sdpa_choice_on_the_cpu_is_torchs_own():
    """On a CPU the engine sets no order: the CPU flash kernel torch picks by itself,
    for grouped-query heads and bf16 as for plain fp32 heads."""
    from trainbench.engine import sdpa
    cpu = torch.device("cpu")
    sdpa.use_engine_order("cpu")
    assert not sdpa._held
    assert sdpa.chosen_backend(cpu, torch.float32, 4, 4, 16, 128) == "flash (CPU, causal)"
    assert sdpa.chosen_backend(cpu, torch.bfloat16, 8, 2, 16, 4096) == "flash (CPU, causal)"
    assert "lower-right causal" in sdpa.chosen_backend(cpu, torch.float32, 4, 4, 16, 128, cp=2)


# --- activation recompute: selective (attention core) and full (whole blocks) ----------

@pytest.mark.parametrize("workload", ["pretrain_llama3.1", "pretrain_nemotronh"])
def test_recompute_modes_give_the_same_gradients_and_keep_less(workload):
    """The same tiny model and batch under recompute none, selective and full: equal
    loss and gradients (the recomputation reruns the same ops), and less kept for the
    backward at each step: selective drops the attention core's own saved tensors
    (output, softmax statistics), full keeps only each block's input."""
    from trainbench.catalog.models import get_model
    from trainbench.engine.models import build_model
    from trainbench.engine.parallel import apply_activation_checkpointing
    spec = get_model(workload, "tiny")
    tokens = torch.randint(0, spec.vocab_size, (2, 64), generator=torch.Generator().manual_seed(1))
    results = {}
    for mode in ("none", "selective", "full"):
        torch.manual_seed(0)
        model = build_model(spec)
        with torch.no_grad():
            model.init_weights()
        apply_activation_checkpointing(model, mode)
        loss, saved = _saved_for_backward(
            lambda: cross_entropy(model(tokens[:, :-1]), tokens[:, 1:]))
        loss.backward()
        grads = {n.replace("_checkpoint_wrapped_module.", ""): p.grad
                 for n, p in model.named_parameters()}
        kept = sum(torch.Size(shape).numel() * dt.itemsize for shape, dt in saved)
        results[mode] = loss.detach(), grads, kept
    base_loss, base_grads, base_kept = results["none"]
    for mode in ("selective", "full"):
        loss, grads, _ = results[mode]
        torch.testing.assert_close(loss, base_loss, rtol=0, atol=0)
        assert grads.keys() == base_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, base_grads[name], rtol=1e-6, atol=1e-7, msg=name)
    assert base_kept > results["selective"][2] > results["full"][2]
