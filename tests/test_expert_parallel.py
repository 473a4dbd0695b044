"""Expert parallelism (issue 20 item 2): the routed experts split over ep data ranks,
tokens dispatched and combined with all_to_all_single, trained by real gloo ranks
through the CLI and compared with one process.

Tolerances. Losses and gradient norms agree with one process to 1e-5 relative (fp32:
only the order of sums differs). The balance loss's gradient is scaled like each
microbatch's loss (1 / microbatches per rank), so it weighs the same in every layout;
unscaled, it weighed 1/dp as much under data parallelism and moved the norm by up to
1.4e-4 at dp=4. Expert gradients summed over the ep group but not divided by ep move it
by 7e-3 (measured: 0.4717 for 0.4684 at step 1); Adam hides that from the losses.
"""

from __future__ import annotations

import json

import pytest

from helpers import losses, read_metrics, train
from trainbench.plan import PlanError, build_plan

LOSS_RTOL = 1e-5
NORM_RTOL = 1e-5


def test_bad_expert_parallel_layouts_are_refused():
    with pytest.raises(PlanError, match="ep=4 does not divide dp=2"):
        build_plan("pretrain_qwen3", "tiny", "fp32", 2, "cpu", overrides={"ep": 4})
    with pytest.raises(PlanError, match="has no experts"):
        build_plan("pretrain_llama3.1", "tiny", "fp32", 2, "cpu", overrides={"ep": 2})
    tiny_experts = build_plan("pretrain_qwen3", "tiny", "fp32", 1, "cpu").model.n_routed_experts
    bad = next(n for n in range(2, 64) if tiny_experts % n)
    with pytest.raises(PlanError, match=f"{tiny_experts} routed experts do not split over "
                                        f"ep={bad}"):
        build_plan("pretrain_qwen3", "tiny", "fp32", bad, "cpu",
                   overrides={"ep": bad, "dp": bad, "gbs": 8 * bad})
    plan = build_plan("pretrain_qwen3", "tiny", "fp32", 4, "cpu", overrides={"ep": 2})
    assert (plan.layout.dp, plan.layout.ep) == (4, 2)
    assert plan.layout.describe() == "TP1 PP1 CP1 DP4 EP2"


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    exp = train(tmp_path_factory.mktemp("one"), "pretrain_qwen3", 1, steps=3)
    return losses(exp), [r["grad_norm"] for r in read_metrics(exp)]


def assert_trains_like_one_process(exp, reference):
    ref_losses, ref_norms = reference
    assert len(losses(exp)) == 3
    assert losses(exp) == pytest.approx(ref_losses, rel=LOSS_RTOL)
    assert [r["grad_norm"] for r in read_metrics(exp)] == pytest.approx(ref_norms,
                                                                       rel=NORM_RTOL)


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("scale", [2, 4], ids=["ep2", "ep2xdp2"])
def test_expert_parallel_trains_like_one_process(tmp_path, one_process, scale):
    """ep=2 over dp=2 (each rank holds half the experts, no FSDP over them) and ep=2
    over dp=4 (two expert groups; each expert FSDP-sharded over the 2 ranks holding it)."""
    exp = train(tmp_path, "pretrain_qwen3", scale, "--set", "ep=2", steps=3)
    assert_trains_like_one_process(exp, one_process)
    info = json.loads((exp / "run.json").read_text())
    assert info["layout"] == f"TP1 PP1 CP1 DP{scale} EP2"
    assert info["world_size"] == scale
