"""predict's weight passes, each a streaming pass over whole weights at the measured copy
rate: the engine's one-rank autocast run casts every fp32 weight to bf16 and its gradient
back each microbatch and accumulates the gradients from the second on; under FSDP2, each
gather casts and copies, each reduction copies into the reduce-scatter buffer, and
gradients accumulate. Hand counts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainbench.catalog.hardware import get_gpu
from trainbench.planning import build_plan
from trainbench.predict.constants import default_constants
from trainbench.predict.perf import predict_step

ONE_RANK = {"tp": 1, "cp": 1, "pp": 1, "dp": 1, "mbs": 1}


def plan_for(dtype: str, gbs: int, gpus: int = 1, **extra):
    layout = dict(ONE_RANK) if gpus == 1 else {"tp": 1, "cp": 1, "pp": 1, "dp": gpus, "mbs": 1}
    return build_plan("pretrain_llama3.1", "8b", dtype, gpus, "h100",
                      overrides=dict(layout, layers=4, gbs=gbs, **extra))


def llama_8b_4_layer_params() -> int:
    """Llama 3.1 8B cut to 4 layers, by hand: embedding and head 128,256 x 4096 each; a
    layer's q (4096 x 4096), k and v (1024 x 4096 each: 8 KV heads of 128), o (4096 x
    4096), gate and up (14336 x 4096 each), down (4096 x 14336), two norms; the final norm."""
    hidden, ffn, vocab, kv = 4096, 14336, 128256, 1024
    layer = 2 * hidden * hidden + 2 * kv * hidden + 3 * ffn * hidden + 2 * hidden
    return 2 * vocab * hidden + 4 * layer + hidden


def test_one_rank_bf16_casts_and_accumulates_by_hand():
    params = llama_8b_4_layer_params()
    assert params == 1_923_125_248  # `trainbench check`'s built count of this proxy
    rate = get_gpu("h100").hbm_tbs * 1e12 * 0.82  # the probe's copy: 2.74 of 3.35 TB/s
    for gbs in (1, 2, 8):
        pred = predict_step(plan_for("bf16", gbs), sharding="engine")
        # 12 B a parameter every microbatch (casts), 12 B from the second (accumulation)
        expected = params * (12 * gbs + 12 * (gbs - 1)) / rate
        assert pred.compute_breakdown["weight_passes"] == pytest.approx(expected, rel=1e-9)


def test_the_passes_are_part_of_the_step():
    plan = plan_for("bf16", 4)
    c = default_constants("h100")
    with_passes = predict_step(plan, sharding="engine", constants=c)
    halved = predict_step(plan, sharding="engine", constants=replace(c, stream_eff=0.41))
    extra = with_passes.compute_breakdown["weight_passes"]
    assert halved.compute_breakdown["weight_passes"] == pytest.approx(2 * extra)
    assert halved.step_time_s - with_passes.step_time_s == pytest.approx(extra)


def fp8_params_of_4_layers() -> int:
    """The FP8 linears' weights FSDP gathers in FP8: q, k, v, o, gate, up, down a layer."""
    hidden, ffn, kv = 4096, 14336, 1024
    return 4 * (2 * hidden * hidden + 2 * kv * hidden + 3 * ffn * hidden)


def test_one_rank_fp8_under_fsdp_by_hand():
    """The default one-rank FP8 plan: FSDP2 on one rank, weights gathered once a step and
    gradients reduced once (dp_sharding=optimizer), bf16 reduction."""
    plan = plan_for("fp8", 4)
    assert (plan.weights_kept_gathered, plan.gradients_reduced_once, plan.reduce_bytes) == (
        True, True, 2)
    params, fp8 = llama_8b_4_layer_params(), fp8_params_of_4_layers()
    plain, m = params - fp8, 4
    # one gather: cast 6 + copy 4 for a bf16-gathered element, a 1 B copy in and out for
    # an FP8 one; torchao's eager cast before it, 27 B, and one amax pass (2 B) a step
    gather = plain * (6 + 4) + fp8 * 2 + fp8 * (27 + 2)
    # one reduction: chunk_cat bf16 to bf16 (2 + 2), the shard cast to fp32 (2 + 4);
    # the microbatches between accumulate unsharded bf16 gradients (2 + 2 read, 2 written)
    reduce = params * (2 + 2) + params * 6 + params * 6 * (m - 1)
    rate = get_gpu("h100").hbm_tbs * 1e12 * 0.82
    pred = predict_step(plan, sharding="engine")
    assert pred.compute_breakdown["weight_passes"] == pytest.approx((gather + reduce) / rate)


def test_two_ranks_fully_sharded_by_hand():
    """FSDP2 over two ranks, resharded after every forward, fp32 reduction each
    microbatch: 8 gathers and 4 reductions a step for 4 microbatches."""
    plan = plan_for("bf16", 8, gpus=2, dp_sharding="full", reduce_dtype="fp32")
    params, n, m = llama_8b_4_layer_params(), 2, 4
    # a gather: cast 6 and copy-in 4 of the shard, copy-out 4 of the whole unit
    gathers = 2 * m * params * ((6 + 4) / n + 4)
    # a reduction: chunk_cat bf16 into fp32 (2 + 4); from the second on, the fp32 shard
    # is added into the accumulated one (4 + 4 read, 4 written)
    reductions = m * params * (2 + 4) + (m - 1) * params / n * 12
    rate = get_gpu("h100").hbm_tbs * 1e12 * 0.82
    pred = predict_step(plan, sharding="engine")
    assert pred.compute_breakdown["weight_passes"] == pytest.approx((gathers + reductions) / rate)


@pytest.mark.parametrize("case", ["recipe sharding", "fp32"])
def test_no_weight_passes_for_a_recipe_or_fp32(case):
    plan, sharding = plan_for("bf16", 4), "engine"
    if case == "recipe sharding":  # Megatron: bf16 weights, fused accumulation
        sharding = "recipe"
    else:
        plan = build_plan("pretrain_llama3.1", "tiny", "fp32", 1, "h100",
                          overrides=dict(ONE_RANK, gbs=4))
    pred = predict_step(plan, sharding=sharding)
    assert pred.compute_breakdown.get("weight_passes", 0.0) == 0.0
