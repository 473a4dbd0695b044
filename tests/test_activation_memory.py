"""The activations the engine keeps for the backward, layer by layer, against predict's
memory model of the engine.

A real-width layer of a seed row is built under a fake process group of the row's world
size and traced under FakeTensorMode with torch's FSDPMemTracker (as `check --trace`
does): a layer's activations are the activations alive after a microbatch's forward with
that layer, less those without it, on rank 0 of the row's layout. Predict's figure for the same kind of layer (`--sharding engine`)
must agree within ACT_RTOL: the memory model answers to what the engine really keeps.
Measured on torch 2.13.0: within 0.8% for every layer kind below; without keeping only
the inputs of the cheap ops, 12% (Nemotron-H's MLP) to 431% (its Mamba-2 mixer) above.

Also checked: keeping only the inputs of norms, activation functions and the Mamba-2
mixer (parallel/__init__.py) changes no number, only what is kept.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainbench.planning import build_plan
from trainbench.predict.context import ENGINE, make_context

ACT_RTOL = 0.03


def _plan(workload, size, dtype, gpus, layers, **overrides):
    overrides = {"compile": False, **overrides}
    plan = build_plan(workload, size, dtype, gpus, "h100", overrides=overrides)
    model = plan.model
    if model.is_hybrid:
        model = dataclasses.replace(model, pattern=model.pattern[:layers], layers=layers)
    else:
        model = model.with_layers(layers)
    return dataclasses.replace(plan, model=model)


def _traced_activations(plan) -> int:
    """Bytes of the activations alive after one microbatch's forward on rank 0: what the
    backward will read (and the logits, which cancel in a difference)."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from trainbench.check.build import _cp_memory_standin, build_rank
    from trainbench.engine.optim import build_optimizer
    trainer = build_rank(plan, 0)
    try:
        inputs, labels = next(trainer.context_shard(i, t) for i, t in trainer.step_batches(0))
        positions = trainer.positions()
        with FakeTensorMode(allow_non_fake_inputs=True), _cp_memory_standin():
            for part in trainer.model_parts:
                part.to_empty(device="cpu")
            tracker = FSDPMemTracker(trainer.model, build_optimizer(trainer.model, plan.lr))
            with tracker:
                with trainer.loss_context(), trainer.compute_context():
                    trainer.model(inputs, positions)
                (current,) = tracker.get_tracker_snapshot("current").values()
    finally:
        dist.destroy_process_group()
    return {str(getattr(k, "value", k)): v for k, v in current.items()}["Activation"]


def _layer_activations(workload, size, dtype, gpus, before, **overrides) -> tuple[int, object]:
    """Traced activations of the layer at index `before` (the plan cut to before + 1
    layers, less the plan cut to `before`), and the longer plan."""
    short = _plan(workload, size, dtype, gpus, before, **overrides)
    long = _plan(workload, size, dtype, gpus, before + 1, **overrides)
    return _traced_activations(long) - _traced_activations(short), long


def _predicted(plan, *kinds: str) -> float:
    work = make_context(plan, sharding=ENGINE, need_device=False).work
    return sum(work[k].act_bytes for k in kinds)


def test_llama31_8b_layer_keeps_what_predict_assumes():
    """Llama 3.1 8B (RMSNorm, SwiGLU, GQA), TP1 x DP8 (the seed row's CP2 cannot be
    traced: tests/test_check.py), MBS 1, sequence 8192: 1.07 GiB per layer. Autograd
    alone kept 1.54 GiB (the fp32 norm copies and silu(gate))."""
    traced, plan = _layer_activations("pretrain_llama3.1", "8b", "bf16", 8, 1, cp=1)
    assert traced == pytest.approx(_predicted(plan, "attention", "mlp"), rel=ACT_RTOL)


def test_llama31_8b_context_parallel_layer_keeps_only_its_keys_and_values():
    """The seed row itself, CP2 x DP4: the engine's all-gather CP keeps only this rank's
    keys and values for the backward and gathers the whole sequence's again there
    (cp.context_parallel_attention, keep_shard), as Megatron's ring keeps its own shard;
    what it keeps beyond Megatron is the chunks' outputs beside their concatenation,
    which predict's engine model counts: 0.565 GiB per layer, 6% over Megatron's
    (0.674 GiB, 27% over, when it kept the gathered keys and values)."""
    traced, plan = _layer_activations("pretrain_llama3.1", "8b", "bf16", 8, 1)
    assert plan.layout.cp == 2
    assert traced == pytest.approx(_predicted(plan, "attention", "mlp"), rel=ACT_RTOL)
    recipe = make_context(plan, sharding="recipe", need_device=False).work
    assert traced < 1.1 * (recipe["attention"].act_bytes + recipe["mlp"].act_bytes)


def test_context_parallel_backward_keeps_the_shard_not_the_whole_sequence(monkeypatch):
    """Counted, one Llama 3.1 8B layer at CP2 (seq 8192, MBS 1): keeping the gathered
    keys and values for the backward holds both whole, grouped heads expanded to the 32
    query heads (2 x 32 x 8192 x 128 x 2 bytes); keeping the shard holds this rank's k
    and v instead (2 x 8 x 4096 x 128 x 2 bytes). The traced difference is exactly that."""
    from trainbench.engine.parallel import cp
    kept_shard, _ = _layer_activations("pretrain_llama3.1", "8b", "bf16", 8, 1)
    monkeypatch.setattr(cp, "keeps_shard", lambda plan: False)
    kept_whole, plan = _layer_activations("pretrain_llama3.1", "8b", "bf16", 8, 1)
    m = plan.model
    whole = 2 * m.heads * plan.seq_len * m.head_dim * 2
    shard = 2 * m.kv_heads * plan.seq_len // plan.layout.cp * m.head_dim * 2
    assert kept_whole - kept_shard == whole - shard


def test_sequence_parallel_backward_keeps_the_shard_per_column_parallel_linear(monkeypatch):
    """Counted, one Nemotron-4 15B layer at TP2 (MBS 2, seq 4096, hidden 6144): each of
    the layer's two gathered inputs (attention's, read by q, k and v; the MLP's, read by
    its up projection) is kept as the rank's shard, [2, 2048, 6144], where DTensor's
    ColwiseParallel kept the whole sequence, [2, 4096, 6144]: the traced difference is
    two halves of a gathered input (tp.GatherSequence)."""
    from trainbench.engine.parallel import tp
    kept_shard, _ = _layer_activations("pretrain_nemotron4", "15b", "bf16", 16, 1)
    monkeypatch.setattr(tp, "keeps_shard", lambda plan: False)
    kept_whole, plan = _layer_activations("pretrain_nemotron4", "15b", "bf16", 16, 1)
    whole_input = plan.mbs * plan.seq_len * plan.model.hidden * 2
    t = plan.layout.tp
    assert kept_whole - kept_shard == 2 * (whole_input - whole_input // t)


def test_nemotron4_15b_tensor_parallel_layer_keeps_the_shard_of_its_inputs():
    """Nemotron-4 15B, TP2 x DP8 with sequence parallelism: each column-parallel linear
    keeps the shard of its input and gathers it again in the backward, as Megatron does
    (tp.GatherSequence), so the layer keeps what Megatron's does: 0.67 GiB per layer,
    where DTensor's ColwiseParallel, which keeps the all-gathered whole-sequence input,
    kept 0.77."""
    traced, plan = _layer_activations("pretrain_nemotron4", "15b", "bf16", 16, 1)
    assert traced == pytest.approx(_predicted(plan, "attention", "mlp"), rel=ACT_RTOL)
    recipe = make_context(plan, sharding="recipe", need_device=False).work
    assert traced == pytest.approx(recipe["attention"].act_bytes + recipe["mlp"].act_bytes,
                                   rel=ACT_RTOL)


@pytest.mark.parametrize("kind,before", [("mamba", 2), ("mlp", 1), ("attention", 7)])
def test_nemotronh_56b_layers_keep_what_predict_assumes(kind, before):
    """Nemotron-H 56B FP8, TP8 x DP4: each kind of hybrid layer (pattern M-M-M-M*-...).
    The Mamba-2 mixer runs the plain PyTorch scan here (no mamba_ssm on a CPU); left to
    autograd it kept 1.30 GiB per layer, 5.4 times this."""
    traced, plan = _layer_activations("pretrain_nemotronh", "56b", "fp8", 32, before)
    assert plan.model.pattern[before] == {"mamba": "M", "mlp": "-", "attention": "*"}[kind]
    assert traced == pytest.approx(_predicted(plan, kind), rel=ACT_RTOL)


@pytest.mark.parametrize("workload", ["pretrain_llama3.1", "pretrain_nemotron4",
                                      "pretrain_nemotronh"])
def test_keeping_only_inputs_changes_no_number(workload):
    """The same tiny model, with and without the rerun norms, activations and mixers:
    bit-identical loss and gradients (fp32, CPU), so every parity test elsewhere holds
    for the engine as it runs."""
    from trainbench.catalog.models import get_model
    from trainbench.engine.models import build_model
    from trainbench.engine.parallel import keep_only_inputs_of_cheap_ops

    spec = get_model(workload, "tiny")
    torch.manual_seed(0)
    plain = build_model(spec)
    lean = build_model(spec)
    lean.load_state_dict(plain.state_dict())
    keep_only_inputs_of_cheap_ops(lean)
    tokens = torch.randint(0, spec.vocab_size, (2, 64))
    positions = torch.arange(64).unsqueeze(0)
    grads = []
    for model in (plain, lean):
        logits = model(tokens, positions)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                 tokens.roll(-1, 1).flatten())
        loss.backward()
        grads.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss_a, grads_a), (loss_b, grads_b) = grads
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name


@pytest.mark.parametrize("workload", ["pretrain_llama3.1", "pretrain_deepseek_v3"])
def test_selective_recompute_changes_no_number(workload):
    """Selective recompute (the attention core; for DeepSeek-V3's MLA every head rebuilt
    from the latents, MLAttention.heads, as Megatron's "mla_up_proj" recompute does) on
    a tiny model: bit-identical loss and gradients to keeping everything (fp32, CPU)."""
    from trainbench.catalog.models import get_model
    from trainbench.engine.models import build_model
    from trainbench.engine.parallel import apply_activation_checkpointing

    spec = get_model(workload, "tiny")
    torch.manual_seed(0)
    plain = build_model(spec)
    lean = build_model(spec)
    lean.load_state_dict(plain.state_dict())
    apply_activation_checkpointing(lean, "selective")
    if workload == "pretrain_deepseek_v3":
        assert all(getattr(m.heads, "__name__", "") == "recomputed"
                   for m in lean.modules() if hasattr(m, "kv_rank"))
    tokens = torch.randint(0, spec.vocab_size, (2, 64))
    positions = torch.arange(64).unsqueeze(0)
    grads = []
    for model in (plain, lean):
        torch.manual_seed(1)  # MoE routing noise, if any, alike
        out = model(tokens, positions)
        logits = out[0] if isinstance(out, tuple) else out
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                 tokens.roll(-1, 1).flatten())
        loss.backward()
        grads.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss_a, grads_a), (loss_b, grads_b) = grads
    assert torch.equal(loss_a, loss_b)
    for name in grads_a:
        if grads_a[name] is not None:
            assert torch.equal(grads_a[name], grads_b[name]), name
