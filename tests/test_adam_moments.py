"""AdamW with bf16 moments (Megatron's precision-aware optimizer, which Megatron-Bridge's
DeepSeek-V3 recipes run): the update against torch's own AdamW, the bytes it keeps, the
recipe rows that take it, predict's charge for it, and a real run that resumes."""

from __future__ import annotations

import json

import pytest

from helpers import assert_resumes_exactly, losses, train
from trainbench.overrides import parse_overrides
from trainbench.planning import build_plan
from trainbench.predict.memory import predict_memory

torch = pytest.importorskip("torch")

from trainbench.engine.optim import AdamWBf16Moments, build_optimizer  # noqa: E402

# Moments rounded to bf16 (8 significant bits) move each step's update by at most about
# 2^-8 of itself; five steps of lr 1e-2 move a weight by at most 5e-2, so the two
# optimizers' weights agree to 5e-2 * 2^-8 * 2 (both moments) = 4e-4.
BF16_MOMENTS_ATOL = 4e-4


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 8, bias=False))


def _train(optimizer_for, steps: int = 5) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = _model()
    optimizer = optimizer_for(model)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(16, 32, generator=gen)
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def test_bf16_moments_update_as_torch_adamw_does_within_their_rounding():
    ours, _ = _train(lambda m: build_optimizer(m, 1e-2, moments="bf16"))
    reference, _ = _train(lambda m: build_optimizer(m, 1e-2))
    assert isinstance(build_optimizer(_model(), 1e-2), torch.optim.AdamW)
    moved = max((a - b).abs().max().item() for a, b in
                zip(reference.parameters(), _model().parameters()))
    assert moved > 1e-2  # the comparison below is over real updates
    for a, b in zip(ours.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, atol=BF16_MOMENTS_ATOL, rtol=0)


def test_bf16_moments_keep_four_bytes_of_state_per_parameter():
    model, optimizer = _train(lambda m: AdamWBf16Moments(m.parameters(), lr=1e-2))
    params = sum(p.numel() for p in model.parameters())
    moment_bytes = sum(t.numel() * t.element_size() for state in optimizer.state.values()
                       for name, t in state.items() if name != "step")
    assert moment_bytes == 4 * params  # two bf16 moments; torch's AdamW keeps 8
    _, reference = _train(lambda m: build_optimizer(m, 1e-2))
    assert sum(t.numel() * t.element_size() for state in reference.state.values()
               for name, t in state.items() if name != "step") == 8 * params


def test_deepseek_recipe_rows_take_bf16_moments_and_predict_charges_them():
    plan = build_plan("pretrain_deepseek_v3", "671b", "fp8", 1024, "h100")
    assert plan.adam_moments == "bf16"
    assert build_plan("pretrain_llama3.1", "70b", "bf16", 64, "h100").adam_moments == "fp32"
    fp32 = build_plan("pretrain_deepseek_v3", "671b", "fp8", 1024, "h100",
                      overrides=parse_overrides(["adam_moments=fp32"]))
    # The engine shards fp32 master weights apart from the moments (FSDP2): its optimizer
    # state is the moments alone, 4 B a parameter in bf16 against 8. Megatron's
    # distributed optimizer counts its fp32 master copy there too: 8 against 12.
    for sharding, ratio in (("engine", 4 / 8), ("recipe", 8 / 12)):
        low, high = (predict_memory(p, sharding=sharding).optimizer for p in (plan, fp32))
        assert low == pytest.approx(ratio * high, rel=1e-9)


@pytest.mark.dist
@pytest.mark.slow
def test_a_run_with_bf16_moments_trains_records_them_and_resumes_exactly(tmp_path):
    moments = ("--set", "adam_moments=bf16")
    full = train(tmp_path, "pretrain_deepseek_v3", 2, *moments, "--checkpoint",
                 "--checkpoint-interval", "2", steps=4, dtype="bf16")
    run = json.loads((full / "run.json").read_text())
    assert run["optimizer"]["moments"] == "bf16"
    reference = train(tmp_path, "pretrain_deepseek_v3", 2, steps=4, dtype="bf16")
    assert json.loads((reference / "run.json").read_text())["optimizer"]["moments"] == "fp32"
    # Same data and weights; the moments' rounding moves the later losses a little.
    assert losses(full) == pytest.approx(losses(reference), rel=1e-2)
    assert losses(full)[1:] != losses(reference)[1:]
    # Iteration 3 needs the restored bf16 moments to repeat the uninterrupted run.
    assert_resumes_exactly(tmp_path, full, "pretrain_deepseek_v3", 2, *moments, dtype="bf16")
