"""`trainbench check` traces MoE plans: the routing's data-dependent reads are answered by
the balanced load (check/routing.py) and torchao's FP8 grouped GEMM kernels, Triton-only,
by their fake implementations (check/grouped_fp8.py)."""

from __future__ import annotations

import pytest
import torch

from trainbench.planning import build_plan


def test_a_count_read_inside_an_moe_layer_is_the_balanced_share():
    """Under expert parallelism the dispatch reads, per rank, the rows it sends
    (counts.view(ep, E / ep).sum(1).tolist()); with 1000 rows over 8 ranks the balanced
    routing sends 125 to each, and 1001 rows put the one left over on rank 0. The inbound
    rows' expert ids (repeat_interleave by the received counts) number the rows."""
    from torch._subclasses.fake_tensor import DataDependentOutputException

    from trainbench.check.routing import BalancedRoutingFakeMode, _layer_rows
    mode = BalancedRoutingFakeMode(allow_non_fake_inputs=True)
    for rows, expected in ((1000, [125] * 8), (1001, [126] + [125] * 7)):
        token = _layer_rows.set(rows)
        try:
            with mode:
                counts = torch.zeros(64, dtype=torch.int64)
                assert counts.view(8, 8).sum(1).tolist() == expected
                ids = torch.repeat_interleave(torch.arange(64), counts)
                assert ids.shape == (rows,)
        finally:
            _layer_rows.reset(token)
    # Outside an MoE layer's experts a read is still an error, not a guess.
    with mode, pytest.raises(DataDependentOutputException):
        torch.zeros(4, dtype=torch.int64).tolist()


def test_an_fp8_moe_plan_traces_within_10_percent_of_predict():
    """Qwen3 30B-A3B's H100 row (16 GPUs, EP16 over DP16) cut to 2 layers: FP8 experts,
    torchao's grouped GEMM on token groups padded by the engine. The traced peak is
    within 10% of predict's engine tensors (measured -1.7%), and the routed experts'
    rows are in it: each MoE layer keeps at least its T x top_k expert rows of the
    hidden size in bf16 for backward."""
    from trainbench.check.build import trace_rank
    from trainbench.check.cli import predicted_for_rank
    plan = build_plan("pretrain_qwen3", "30b_a3b", "fp8", 16, "h100", overrides={"layers": 2})
    assert plan.layout.ep == 16
    traced = trace_rank(plan, 0)
    assert traced["error"] is None, traced["error"]
    spec = plan.model
    expert_rows = plan.mbs * plan.seq_len * spec.top_k * spec.hidden * 2
    assert traced["categories"]["Activation"] > spec.layers * expert_rows
    pred = predicted_for_rank(plan, 0, None)
    tensors = pred["total"] - pred["allowance"]
    assert abs(tensors - traced["peak_bytes"]) <= 0.10 * traced["peak_bytes"], \
        (tensors / 2**30, traced["peak_bytes"] / 2**30)


def test_a_bf16_moe_plan_traces_through_the_expert_loop():
    """DeepSeek-V3's tiny proxy over EP4 in BF16: on a CPU the experts take the loop,
    which reads each local expert's row count, after the dispatch's reads; the sigmoid
    router with its bias and groups runs as in training. Its 3 MoE layers keep at least
    their T x top_k expert rows."""
    from trainbench.check.build import trace_rank
    plan = build_plan("pretrain_deepseek_v3", "tiny", "bf16", 4, "h100", overrides={"ep": 4})
    traced = trace_rank(plan, 0)
    assert traced["error"] is None, traced["error"]
    spec = plan.model
    moe_layers = spec.layers - spec.first_dense_layers
    expert_rows = plan.mbs * plan.seq_len * spec.top_k * spec.hidden * 2
    assert traced["categories"]["Activation"] > moe_layers * expert_rows


def test_bf16_adam_moments_are_counted_as_the_engine_keeps_them():
    """DeepSeek-V3's H100 row keeps AdamW's moments in bf16 (plan.adam_moments,
    engine/optim.py AdamWBf16Moments): the build counts 2 x 2 bytes a parameter it holds,
    half of the fp32 master weights' bytes, and its model state (with the gathered
    weights and whole gradients a pipeline stage keeps) is predict's."""
    from trainbench.check.build import check_rank
    from trainbench.check.cli import built_model_state, predicted_for_rank
    plan = build_plan("pretrain_deepseek_v3", "671b", "fp8", 1024, "h100")
    assert plan.adam_moments == "bf16"
    built = check_rank(plan, 0)
    assert built["error"] is None, built["error"]
    assert built["optimizer_bytes"] == 4 * built["params_local"] == built["param_bytes"]
    pred = predicted_for_rank(plan, 0, None)
    assert built_model_state(built) == pytest.approx(pred["model_state"], rel=0.01)
