"""`trainbench check` on pipeline-parallel plans: the traced schedule, its receive
buffers, the interleaved schedule's gathered stages and the state sharding a pipeline
keeps, each rank's trace standing for its stage's other ranks."""

from __future__ import annotations

import pytest

from trainbench.check.cli import default_ranks
from trainbench.planning import build_plan


def _plan(workload, size, dtype, gpus):
    return build_plan(workload, size, dtype, gpus, "h100")


@pytest.mark.slow
def test_pipeline_ranks_trace_the_whole_schedule_and_its_receive_buffers():
    """Llama 3.1 8B at its real width, 4 layers over PP2 x DP8, 4 microbatches a step:
    both pipeline ranks run torch's 1F1B schedule under FakeTensorMode. The engine's
    stages allocate each receive buffer (hidden states for a stage after the first,
    their gradient for a stage before the last) when its receive is posted and let it
    go after the microbatch's backward (pp._ReceivingWhenNeeded): the set-up leaves
    none, and the trace counts the ones alive at its peak with the rest. Predict's
    engine model is within 10% of the traced peak (tensors on both sides)."""
    from trainbench.check.build import trace_rank
    from trainbench.check.cli import predicted_for_rank
    plan = build_plan("pretrain_llama3.1", "8b", "bf16", 16, "h100",
                      overrides={"pp": 2, "tp": 1, "cp": 1, "layers": 4, "gbs": 32,
                                 "compile": False})
    assert (plan.layout.dp, plan.ga, plan.mbs) == (8, 4, 1)
    for rank, pp_rank in ((0, 0), (8, 1)):
        traced = trace_rank(plan, rank)
        assert traced["error"] is None, traced["error"]
        assert traced["microbatches"] == 4
        assert traced["pipeline_buffer_bytes"] == 0
        pred = predicted_for_rank(plan, pp_rank, None)
        tensors = pred["total"] - pred["allowance"]
        assert abs(tensors - traced["peak_bytes"]) <= 0.10 * traced["peak_bytes"], \
            (rank, tensors / 2**30, traced["peak_bytes"] / 2**30)


def test_interleaved_trace_peak_does_not_grow_with_microbatches_and_three_stages_gathered():
    """Llama 3.1 8B at its real width, 8 layers over PP2 x VP4 (one layer a virtual stage),
    rank 0 traced with 8 and with 16 microbatches. Once the interleaved schedule's warm-up
    is full (9 stage forwards in flight on rank 0), more microbatches add nothing: the
    whole peak, receive buffers included, must not grow. torch's own PipelineStage kept a
    receive buffer per microbatch and stage all step (3 for hidden states and 4 for
    gradients per microbatch on rank 0's stages 0, 2, 4, 6, each 8192 x 4096 x 2 bytes:
    3.5 GiB more at 16 microbatches than at 8); the engine's stages allocate each one
    when its receive is posted and let it go after that microbatch's backward
    (pp._ReceivingWhenNeeded). Torch's schedule runtime
    keeps at most three of the four virtual stages' bf16 weights gathered; predict and the
    build count the three largest (the embedding's stage and two one-layer stages). No
    sharded gradient exists before the step's last backward, in the trace, the build or
    predict."""
    from trainbench.check.build import check_rank, trace_rank
    from trainbench.predict.memory import predict_memory
    traced = {}
    for gbs in (64, 128):
        plan = build_plan("pretrain_llama3.1", "8b", "bf16", 16, "h100",
                          overrides={"pp": 2, "vp": 4, "tp": 1, "cp": 1, "layers": 8,
                                     "gbs": gbs, "compile": False, "reduce_dtype": "fp32"})
        traced[gbs] = trace_rank(plan, 0, pipeline_microbatches=plan.ga)
        assert traced[gbs]["error"] is None, traced[gbs]["error"]
        assert traced[gbs]["pipeline_buffer_bytes"] == 0
    assert (traced[64]["microbatches"], traced[128]["microbatches"]) == (8, 16)
    # Under FSDPMemTracker each stage's received input outlived its microbatch (3 a
    # microbatch on rank 0, 3 x 8 messages more at 16 microbatches than at 8) until the
    # trace released it where the engine does (build._received_inputs_released).
    message = 8192 * 4096 * 2
    grown = traced[128]["peak_bytes"] - traced[64]["peak_bytes"]
    assert abs(grown) < 2**20, grown / message
    # By default a pipeline rank traces 4 x PP microbatches (8 of the step's 16).
    short = trace_rank(plan, 0)
    assert (short["microbatches"], short["step_microbatches"]) == (8, 16)
    assert abs(short["peak_bytes"] - traced[64]["peak_bytes"]) < 2**20
    # 2 x PP microbatches already reach it, now that received inputs do not pile up.
    shorter = trace_rank(plan, 0, pipeline_microbatches=4)
    assert abs(traced[128]["peak_bytes"] - shorter["peak_bytes"]) < 2**20
    hidden, kv, vocab, mlp = 4096, 1024, 128256, 14336
    layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * mlp + 2 * hidden
    three_stages = 2 * (vocab * hidden + 3 * layer)  # bf16: the embedding's and two more
    gathered_at_peak = traced[128]["categories"]["Unsharded Param"]
    assert 2 * (vocab * hidden + layer) <= gathered_at_peak <= three_stages
    built = check_rank(plan, 0)
    fp32_grads = 4 * built["params_tp_local"]
    assert built["whole_in_step_bytes"] == three_stages + fp32_grads
    predicted = predict_memory(plan, sharding="engine")
    assert predicted.weights - 4 * built["params_local"] == pytest.approx(three_stages,
                                                                           rel=1e-3)
    # Gradients are reduce-scattered only after the step's last backward: at the peak
    # the stage's unsharded fp32 gradients (the tracker's temporaries) are the only ones.
    assert not {"Sharded Grad", "Unsharded Grad"} & set(traced[128]["categories"])
    assert built["grad_bytes"] == 0
    assert predicted.gradients == pytest.approx(fp32_grads, rel=1e-3)


def test_distributed_optimizer_sharding_keeps_weights_and_gradients_whole_all_step():
    """Llama 3.1 8B's seed layout (TP1 CP2 DP4) at its real width, cut to 4 layers, traced
    under the engine's default (FSDP2 as ZeRO-3), dp_sharding=gradients (ZeRO-2) and
    dp_sharding=optimizer (ZeRO-1, the memory layout of the Megatron distributed optimizer
    the seed ran), with bf16 gradient reduction. Under optimizer, at the peak every bf16
    weight is gathered and every bf16 gradient whole, and no sharded gradient exists yet;
    under gradients the weights are gathered and the gradients sharded. The activations
    are the same program's, so they must not move. predict (--sharding engine) follows
    within 10%."""
    from trainbench.check.build import check_rank, trace_rank
    from trainbench.predict.memory import predict_memory
    hidden, kv, vocab, mlp, layers = 4096, 1024, 128256, 14336, 4
    layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * mlp + 2 * hidden
    params = 2 * vocab * hidden + layers * layer + hidden  # untied head, final norm
    traced, plans = {}, {}
    for sharding in ("full", "gradients", "optimizer"):
        plans[sharding] = build_plan("pretrain_llama3.1", "8b", "bf16", 8, "h100", overrides={
            "layers": layers, "compile": False, "dp_sharding": sharding, "reduce_dtype": "bf16"})
        traced[sharding] = trace_rank(plans[sharding], 0)
        assert traced[sharding]["error"] is None, traced[sharding]["error"]
    full, whole = traced["full"]["categories"], traced["optimizer"]["categories"]
    assert "Sharded Grad" in full and "Sharded Grad" not in whole
    assert whole["Unsharded Param"] == pytest.approx(2 * params, rel=1e-3)
    assert whole["Unsharded Grad"] == pytest.approx(2 * params, rel=1e-3)
    assert full["Unsharded Param"] < 0.7 * 2 * params  # two blocks and the root at most
    assert whole["Activation"] == pytest.approx(full["Activation"], rel=0.02)
    kept = traced["gradients"]["categories"]
    assert kept["Unsharded Param"] == pytest.approx(2 * params, rel=1e-3)
    assert kept["Sharded Grad"] == pytest.approx(full["Sharded Grad"], rel=1e-6)
    assert kept.get("Unsharded Grad", 0) < 0.2 * 2 * params  # a unit's, not the model's
    assert kept["Activation"] == pytest.approx(full["Activation"], rel=0.02)
    built = check_rank(plans["optimizer"], 0)
    assert built["grad_bytes"] == 0 and built["whole_in_step_bytes"] == 4 * params
    built = check_rank(plans["gradients"], 0)
    assert built["grad_bytes"] == built["param_bytes"]
    assert built["whole_in_step_bytes"] == 2 * params
    for sharding in ("gradients", "optimizer"):
        predicted = predict_memory(plans[sharding], sharding="engine")
        tensors = predicted.total - predicted.allowance
        assert tensors == pytest.approx(traced[sharding]["peak_bytes"], rel=0.10)
        assert f"dp_sharding={sharding}" in predicted.assumption


def test_one_trace_per_stage_stands_for_the_stages_other_ranks():
    """Llama 3.1 8B's width over TP4 PP2 DP3, one layer a stage: DP3 shards every weight
    unevenly, so the last DP rank of a stage holds fewer parameters and AdamW moments than
    the first. check traces ranks 0 and 12 (one a stage, in two spawned processes) and
    gives ranks 11 and 23 their stage's trace with their own moments; tracing 11 and 23
    themselves gives the same peaks to the byte."""
    from trainbench.check.build import trace_rank
    from trainbench.check.cli import check_plan
    plan = build_plan("pretrain_llama3.1", "8b", "bf16", 24, "h100",
                      overrides={"pp": 2, "tp": 4, "cp": 1, "layers": 2, "gbs": 6,
                                 "compile": False})
    assert plan.layout.describe() == "TP4 PP2 CP1 DP3"
    data = check_plan(plan, default_ranks(plan), jobs=2)
    ranks = {r["rank"]: r for r in data["ranks"]}
    assert sorted(ranks) == [0, 11, 12, 23]
    assert ranks[11]["optimizer_bytes"] < ranks[0]["optimizer_bytes"]
    for rank, stands_for in ((11, 0), (23, 12)):
        reused = ranks[rank]["trace"]
        assert reused["traced_rank"] == stands_for and "traced_rank" not in ranks[stands_for]["trace"]
        assert reused["optimizer_bytes"] == ranks[rank]["optimizer_bytes"]
        own = trace_rank(plan, rank)
        assert own["error"] is None, own["error"]
        assert reused["peak_bytes"] == own["peak_bytes"]
        assert reused["peak_bytes"] != ranks[stands_for]["trace"]["peak_bytes"]
