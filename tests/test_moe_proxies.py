"""Real-width MoE proxies on one GPU (issue 35, item 4): Qwen3 30B-A3B and 235B-A22B in
bf16 with a layout given by --set (neither has a published H100 bf16 recipe), and
DeepSeek-V3 with fewer routed experts (`--set experts=N`), which keeps top_k and the
expert width so the FLOPs per token stay. Each says it is a proxy with no published
reference; predict, the FLOPs and `show` read the same cut model.

Pure Python plans and predictions, plus `show` through the real CLI: a few seconds.
"""

from __future__ import annotations

import pytest

from helpers import run_cli
from trainbench import flops as fl
from trainbench.catalog.models import get_model, parameter_count
from trainbench.overrides import parse_overrides
from trainbench.plan import PlanError
from trainbench.planning import build_plan
from trainbench.predict.context import ENGINE
from trainbench.predict.perf import predict_step

ONE_GPU = "tp=1 pp=1 cp=1 vp=1 dp=1 ep=1 mbs=1 gbs=2"


def one_gpu_plan(workload, size, dtype, settings, gpu="h100"):
    return build_plan(workload, size, dtype, 1, gpu,
                      overrides=parse_overrides([f"{settings} {ONE_GPU}"]), steps=8)


@pytest.mark.parametrize("size", ["30b_a3b", "235b_a22b"])
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_qwen3_proxies_plan_on_one_gpu_in_bf16_and_fp8(size, dtype):
    """Qwen3 30B-A3B has only FP8/MXFP8 recipes and 235B-A22B's bf16 ones are GB200/GB300
    layouts: with the layout given in --set both plan on one H100 in either dtype, at
    the real width (all 128 experts, top 8), and the plan's note says it is a proxy
    without a published reference."""
    plan = one_gpu_plan("pretrain_qwen3", size, dtype, "layers=1")
    full = get_model("pretrain_qwen3", size)
    assert plan.model == full.with_layers(1)
    assert plan.layout.describe() == "TP1 PP1 CP1 DP1"
    assert "a proxy of " + full.name in plan.recipe_note
    assert "1 layer, 128 routed experts, top 8" in plan.recipe_note
    assert "no published reference" in plan.recipe_note


def test_a_size_without_a_recipe_in_this_dtype_still_needs_a_layout():
    """Without --set layout keys the missing recipe is still an error naming the dtypes."""
    with pytest.raises(PlanError, match="30b_a3b has no bf16 recipe; dtypes: fp8, mxfp8"):
        build_plan("pretrain_qwen3", "30b_a3b", "bf16", 1, "h100")


def test_experts_keep_top_k_the_expert_width_and_the_flops_per_token():
    """`experts=8` of DeepSeek-V3's 256: top 8 of expert width 2048 as before, so every
    GEMM a token passes through is the same; only the router's logits shrink (hidden x
    experts per token per MoE layer). Group-limited routing (4 of 8 groups) would leave
    4 experts eligible for 8 picks: it is off. At 16 experts it stays (2 per group,
    4 groups: 8 eligible)."""
    full = get_model("pretrain_deepseek_v3", "671b").with_layers(4)
    proxy = one_gpu_plan("pretrain_deepseek_v3", "671b", "bf16", "layers=4 experts=8").model
    assert (proxy.n_routed_experts, proxy.top_k, proxy.moe_ffn) == (8, 8, 2048)
    assert (proxy.n_group, proxy.topk_group) == (1, 1)
    assert (proxy.n_shared_experts, proxy.first_dense_layers) == (1, 3)
    moe_layers = 4 - 3
    for conv in fl.CONVENTIONS:
        router = 6 * full.seq_len * full.hidden * (256 - 8) * moe_layers
        assert fl.flops_per_sequence(full, convention=conv) - fl.flops_per_sequence(
            proxy, convention=conv) == router
    assert parameter_count(full) - parameter_count(proxy) == moe_layers * (
        (256 - 8) * (3 * 7168 * 2048 + 7168))
    sixteen = full.with_experts(16)
    assert (sixteen.n_group, sixteen.topk_group) == (8, 4)


def test_bad_expert_counts_are_refused_in_one_line():
    for settings, message in (
            ("experts=4", "--set experts=4: DeepSeek-V3 671B routes each token to top_k = 8 "
                          "experts; it needs at least 8"),
            ("experts=0", "--set experts=0: an MoE needs at least 1 routed expert"),
            ("experts=12 ep=8 dp=8", "12 routed experts do not split over ep=8")):
        with pytest.raises(PlanError) as err:
            build_plan("pretrain_deepseek_v3", "671b", "bf16", 8, "h100",
                       overrides=parse_overrides([f"layers=4 tp=1 pp=1 cp=1 vp=1 {settings}"]))
        assert len(err.value.problems) == 1 and message in err.value.problems[0]
    with pytest.raises(PlanError, match="Llama 3.1 8B has no experts"):
        build_plan("pretrain_llama3.1", "8b", "bf16", 8, "h100",
                   overrides=parse_overrides(["experts=8"]))


def test_predict_follows_the_expert_count():
    """predict models the cut model: the proxy with 8 experts holds 248 fewer experts'
    weights and optimizer state in its MoE layer, and fits one H100 with full recompute
    (4 layers: 3 dense, 1 MoE), where all 256 experts need about twice the memory."""
    plans = {E: one_gpu_plan("pretrain_deepseek_v3", "671b", "bf16",
                             f"layers=4 experts={E} recompute=full") for E in (8, 256)}
    preds = {E: predict_step(p, sharding=ENGINE) for E, p in plans.items()}
    assert preds[8].memory.fits and not preds[256].memory.fits
    assert preds[256].memory.total > 1.8 * preds[8].memory.total
    removed = 248 * 3 * 7168 * 2048
    # Weights, fp32 master weights and Adam's moments, as predict counts them for one
    # rank: the same bytes per parameter whatever the expert count.
    state = {E: p.memory.weights + p.memory.optimizer for E, p in preds.items()}
    per_param = state[8] / parameter_count(plans[8].model)
    assert state[256] - state[8] == pytest.approx(per_param * removed, rel=0.01)


def test_show_prints_the_cut_model():
    res = run_cli("show", "-w", "pretrain_deepseek_v3", "-s", "671b", "--set",
                  "layers=4 experts=8")
    assert res.returncode == 0, res.stderr
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in res.stdout.splitlines() if line.count("│") >= 3}
    assert rows["n_routed_experts"] == "8" and rows["top_k"] == "8"
    assert rows["n_group"] == "1" and rows["layers"] == "4"
    proxy = get_model("pretrain_deepseek_v3", "671b").with_layers(4).with_experts(8)
    assert rows["parameters"].startswith(f"{parameter_count(proxy):,}")
