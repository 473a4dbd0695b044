"""bf16 master weights (plan.master_weights): the bf16 parameters kept as the only copy the
optimizer updates, as the Nemotron-4 340B seed's Apex DistributedFusedAdam with bf16 state
kept them (catalog.recipes.APEX_BF16_ADAM_RECIPES). The update against the fp32-master
one, the plans that take it and refuse it, what the engine builds and records, predict's
bytes for it, and a real two-rank run that resumes exactly."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import assert_resumes_exactly, losses, train
from trainbench.catalog import recipes
from trainbench.overrides import parse_overrides
from trainbench.planning import build_plan
from trainbench.predict.context import ENGINE, make_context
from trainbench.predict.memory import predict_memory

torch = pytest.importorskip("torch")

from trainbench.engine.optim import AdamWBf16Moments  # noqa: E402


def _weights_and_grads(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(64, 48, generator=gen), torch.randn(48, generator=gen)]
    grads = [torch.randn(w.shape, generator=gen) * 1e-2 for w in weights]
    return [w.to(torch.bfloat16) for w in weights], [g.to(torch.bfloat16) for g in grads]


def test_a_bf16_master_weight_is_the_fp32_update_rounded_once():
    """Two steps from the same bf16 weights and gradients: the bf16 master's update is the
    fp32-master update of the same values, rounded to bf16 once per step. Rounding after
    the weight decay and again after the Adam term (two in-place bf16 operations) differs
    from it."""
    weights, grads = _weights_and_grads()
    bf16 = [torch.nn.Parameter(w.clone()) for w in weights]
    fp32 = [torch.nn.Parameter(w.to(torch.float32)) for w in weights]
    ours = AdamWBf16Moments(bf16, lr=1e-2, weight_decay=0.1)
    reference = AdamWBf16Moments(fp32, lr=1e-2, weight_decay=0.1)
    for _ in range(2):
        for p, q, g in zip(bf16, fp32, grads):
            p.grad, q.grad = g.clone(), g.to(torch.float32)
        ours.step()
        reference.step()
        for p, q in zip(bf16, fp32):
            assert p.dtype == torch.bfloat16
            assert torch.equal(p, q.to(torch.bfloat16))
            # The next step starts the reference from the same bf16 values.
            q.data.copy_(p.to(torch.float32))
    # Rounded twice, the first step already differs somewhere.
    twice = [w.clone() for w in weights]
    for w, g in zip(twice, grads):
        w.mul_(1 - 1e-2 * 0.1)
        update = g.float() / (g.float().abs() + 1e-8)  # step 1: m / sqrt(v) = sign(g)
        w.add_(update, alpha=-1e-2)
    once = [(w.float() * (1 - 1e-2 * 0.1) - 1e-2 * g.float() / (g.float().abs() + 1e-8))
            .to(torch.bfloat16) for w, g in zip(weights, grads)]
    assert any(not torch.equal(a, b) for a, b in zip(twice, once))


def test_the_apex_bf16_recipe_rows_take_bf16_master_weights_and_others_do_not():
    for dtype in ("bf16", "fp8"):
        plan = build_plan("pretrain_nemotron4", "340b", dtype, 128, "h100")
        assert plan.recipe_source in recipes.APEX_BF16_ADAM_RECIPES
        assert (plan.master_weights, plan.adam_moments) == ("bf16", "bf16")
    for args in (("pretrain_nemotron4", "340b", "fp8", 256), ("pretrain_deepseek_v3", "671b",
                                                               "fp8", 1024),
                 ("pretrain_llama3.1", "70b", "bf16", 64)):
        assert build_plan(*args, "h100").master_weights == "fp32", args


def test_bf16_master_weights_without_bf16_moments_or_in_fp32_are_refused(tmp_path):
    cases = [("bf16", "master_weights=bf16", "adam_moments=bf16"),
             ("fp32", "master_weights=bf16 adam_moments=bf16", "bf16 or FP8 run")]
    for dtype, settings, said in cases:
        res = subprocess.run(
            [sys.executable, "-m", "trainbench.cli", "run", "-w", "pretrain_llama3.1", "-s",
             "tiny", "--dtype", dtype, "--scale", "1", "--gpu", "cpu", "--set", settings,
             "--dry-run"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert res.returncode == 2, res.stdout + res.stderr
        assert said in res.stderr and "Traceback" not in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "experiments").exists()


def test_predict_charges_two_bytes_a_master_weight_and_its_gradient():
    """Hand count on the 340B FP8 x128 row's rank 0: bf16 masters hold 2 B a parameter of
    the FSDP shard where fp32 ones hold 4, for the weights; under PP the gradients stay
    whole in the reduce dtype (bf16) either way, and the bf16 moments are the same."""
    plan = build_plan("pretrain_nemotron4", "340b", "fp8", 128, "h100")
    fp32 = build_plan("pretrain_nemotron4", "340b", "fp8", 128, "h100",
                      overrides=parse_overrides(["master_weights=fp32"]))
    ctx = make_context(plan, sharding=ENGINE, need_device=False)
    kinds: dict[str, int] = {}
    for chunk in ctx.rank_counts[0]:
        for kind, n in chunk.items():
            kinds[kind] = kinds.get(kind, 0) + n
    shard_params = sum(ctx.work[k].params * n for k, n in kinds.items()) / plan.layout.dp
    ours, theirs = (predict_memory(p, sharding="engine") for p in (plan, fp32))
    assert theirs.weights - ours.weights == pytest.approx(2 * shard_params, rel=1e-9)
    assert (ours.gradients, ours.optimizer) == (theirs.gradients, theirs.optimizer)
    assert ours.total < theirs.total


def test_the_engine_builds_bf16_masters_but_mamba_s_fp32_parameters():
    """A rank of the tiny Nemotron-H built as `check` builds it (meta device, fake group):
    every parameter bf16 but the Mamba-2 mixers' dt_bias, A_log and D."""
    import torch.distributed as dist

    from trainbench.check.build import build_rank
    plan = build_plan("pretrain_nemotronh", "tiny", "bf16", 2, "cpu",
                      overrides=parse_overrides(["adam_moments=bf16", "master_weights=bf16"]))
    trainer = build_rank(plan, 0)
    try:
        dtypes = {name.rsplit(".", 1)[-1]: p.dtype for name, p in
                  trainer.model.named_parameters()}
    finally:
        dist.destroy_process_group()
    fp32 = {name for name, dtype in dtypes.items() if dtype == torch.float32}
    assert fp32 == {"dt_bias", "A_log", "D"}
    assert {dtype for name, dtype in dtypes.items() if name not in fp32} == {torch.bfloat16}


@pytest.mark.dist
@pytest.mark.slow
def test_a_two_rank_run_with_bf16_master_weights_trains_records_them_and_resumes(tmp_path):
    bf16 = ("--set", "adam_moments=bf16 master_weights=bf16")
    full = train(tmp_path, "pretrain_llama3.1", 2, *bf16, "--checkpoint",
                 "--checkpoint-interval", "2", steps=4, dtype="bf16")
    run = json.loads((full / "run.json").read_text())
    assert run["optimizer"]["master_weights"] == "bfloat16"
    assert "master weights bf16 (the only copy" in next(full.glob("log-*.out")).read_text()
    reference = train(tmp_path, "pretrain_llama3.1", 2, "--set", "adam_moments=bf16",
                      steps=4, dtype="bf16")
    assert json.loads((reference / "run.json").read_text())["optimizer"]["master_weights"] \
        == "float32"
    # The same start (the fp32 initialisation rounded to bf16 is what the fp32-master run
    # computes with too); the updates' rounding moves the later losses a little.
    assert losses(full)[0] == pytest.approx(losses(reference)[0], rel=1e-3)
    assert losses(full) == pytest.approx(losses(reference), rel=2e-2)
    assert losses(full)[1:] != losses(reference)[1:]
    assert_resumes_exactly(tmp_path, full, "pretrain_llama3.1", 2, *bf16, dtype="bf16")
    # A checkpoint of bf16 masters does not load into a run of fp32 ones.
    res = subprocess.run(
        [sys.executable, "-m", "trainbench.cli", "run", "-w", "pretrain_llama3.1", "-s", "tiny",
         "--dtype", "bf16", "--scale", "2", "--gpu", "cpu", "--steps", "2", "--set",
         "adam_moments=bf16", "--load-checkpoint", str(full / "checkpoints" / "step-2")],
        capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "master_dtype bfloat16 (checkpoint) vs float32 (this run)" in res.stderr
