"""predict's weight passes, each a streaming pass over whole weights at the measured copy
rate, or at torch's measured eager upcast rate where a gradient is cast back to fp32
outside a compiled graph: the engine's one-rank autocast run casts every fp32 weight but
the embedding to bf16 and its gradient back each microbatch and accumulates the gradients
from the second on; under FSDP2, each gather casts and copies, each reduction copies into
the reduce-scatter buffer (and casts a bf16-reduced shard up), and gradients accumulate.
Hand counts."""

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
    embedding = 128_256 * 4096
    head = embedding + 4096  # with the final norm, outside the compiled blocks too
    hbm = get_gpu("h100").hbm_tbs * 1e12
    stream, upcast = hbm * 0.82, hbm * 0.45  # the probe's copy; torch's eager upcast
    for gbs in (1, 2, 8):
        pred = predict_step(plan_for("bf16", gbs), sharding="engine")
        # Every microbatch: each weight but the embedding cast to bf16 (6 B), its gradient
        # cast back (6 B; the head's eagerly, the blocks' inside their compiled graphs),
        # the embedding's fresh fp32 gradient zeroed (4 B); from the second microbatch,
        # every gradient accumulated (12 B).
        streamed = (gbs * ((params - embedding) * 6 + (params - embedding - head) * 6
                           + embedding * 4) + params * 12 * (gbs - 1))
        expected = streamed / stream + gbs * head * 6 / upcast
        assert pred.compute_breakdown["weight_passes"] == pytest.approx(expected, rel=1e-9)


def test_uncompiled_one_rank_casts_every_gradient_eagerly():
    params, embedding = llama_8b_4_layer_params(), 128_256 * 4096
    hbm = get_gpu("h100").hbm_tbs * 1e12
    pred = predict_step(plan_for("bf16", 2, compile=False), sharding="engine")
    streamed = 2 * ((params - embedding) * 6 + embedding * 4) + params * 12
    expected = streamed / (hbm * 0.82) + 2 * (params - embedding) * 6 / (hbm * 0.45)
    assert pred.compute_breakdown["weight_passes"] == pytest.approx(expected, rel=1e-9)


def test_the_routed_experts_gradients_are_cast_eagerly():
    """An MoE layer's routed experts run between two compiled graphs: their gradients come
    back to fp32 at the eager rate, by hand for Qwen3 30B-A3B cut to 2 layers."""
    plan = build_plan("pretrain_qwen3", "30b_a3b", "bf16", 1, "h200",
                      overrides=dict(ONE_RANK, layers=2, gbs=2, ep=1, vp=1))
    experts = 2 * 128 * 3 * 2048 * 768  # 2 layers of 128 experts: w1, w3 [768, 2048], w2
    head = 151_936 * 2048 + 2048  # the output head and the final norm
    with_experts = predict_step(plan, sharding="engine").compute_breakdown["weight_passes"]
    hbm = get_gpu("h200").hbm_tbs * 1e12
    # Against the same passes had the experts' upcasts run at the streaming rate:
    moved = 2 * experts * 6 * (1 / (hbm * 0.45) - 1 / (hbm * 0.82))
    c = default_constants("h200")
    streamed_only = predict_step(plan, sharding="engine", constants=replace(
        c, eager_upcast_eff=c.stream_eff)).compute_breakdown["weight_passes"]
    head_moved = 2 * head * 6 * (1 / (hbm * 0.45) - 1 / (hbm * 0.82))
    assert with_experts - streamed_only == pytest.approx(moved + head_moved, rel=1e-9)


def test_the_passes_are_part_of_the_step():
    pred = predict_step(plan_for("bf16", 4), sharding="engine")
    passes = pred.compute_breakdown["weight_passes"]
    assert passes > 0.05 * pred.step_time_s
    assert pred.breakdown["compute"] == pytest.approx(sum(pred.compute_breakdown.values()))
    assert pred.step_time_s == pytest.approx(sum(pred.breakdown.values()))


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
    # one reduction: chunk_cat bf16 to bf16 (2 + 2), the shard cast to fp32 (2 + 4, torch's
    # eager upcast); the microbatches between accumulate unsharded bf16 gradients (2 + 2
    # read, 2 written)
    reduce = params * (2 + 2) + params * 6 * (m - 1)
    hbm = get_gpu("h100").hbm_tbs * 1e12
    pred = predict_step(plan, sharding="engine")
    expected = (gather + reduce) / (hbm * 0.82) + params * 6 / (hbm * 0.45)
    assert pred.compute_breakdown["weight_passes"] == pytest.approx(expected)


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
