"""The published MoE layouts (catalog), their FLOPs against NVIDIA's printed TFLOPS, and
predict's MoE model: the token all-to-all, the grouped expert GEMMs, every published row.

All in-process and pure Python (no torch, no runs): a few seconds.
"""

from __future__ import annotations

import math

import pytest

from trainbench import flops as fl
from trainbench.catalog import recipes
from trainbench.catalog.heldout import HELD_OUT_MOE
from trainbench.catalog.models import get_model
from trainbench.plan import PlanError
from trainbench.planning import build_plan
from trainbench.predict.comm import (Group, all_to_all_s, latency_s, moe_all_to_all_bytes,
                                     moe_dispatch_s)
from trainbench.predict.constants import default_constants
from trainbench.predict.device import device_for
from trainbench.predict.perf import gemm_efficiency, predict_step
from trainbench.predict.published import published_plan
from trainbench.predict.work import Shape, layer_work

REAL = [("pretrain_qwen3", "30b_a3b"), ("pretrain_qwen3", "235b_a22b"),
        ("pretrain_deepseek_v3", "671b")]


def _plan(row):
    return published_plan(row.workload, row.size, row.dtype, row.gpus, row.gpu_type,
                          tp=row.tp, pp=row.pp, cp=row.cp, ep=row.ep, vp=row.vp, mbs=row.mbs,
                          gbs=row.gbs, seq_len=row.seq_len)


@pytest.mark.parametrize("workload,size", REAL)
def test_real_sizes_have_published_h100_rows(workload, size):
    rows = recipes.rows_for(workload, size, gpu_type="h100")
    assert rows, f"{workload} {size}: no H100 recipe row"
    for r in rows:
        assert "Megatron-Bridge docs/performance-summary.md @" in r.source
        assert r.ep > 1 and "ETP 1" in r.note
        assert r.tp * r.pp * r.cp * r.dp == r.gpus
        assert r.gbs == r.mbs * r.dp * r.ga
        # The recipe row is the same layout as a published step time.
        assert any((h.workload, h.size, h.dtype, h.gpu_type, h.gpus, h.tp, h.pp, h.vp, h.ep,
                    h.mbs, h.gbs) == (r.workload, r.size, r.dtype, r.gpu_type, r.gpus, r.tp,
                                      r.pp, r.vp, r.ep, r.mbs, r.gbs) for h in HELD_OUT_MOE)


def test_published_layouts_plan_and_fp8_moe_is_refused_on_a_cpu_in_one_line():
    # The H100 rows (FP8, EP32 over TP2 x DP16 for 235B-A22B: EP spans the stage's ranks)
    # plan with their own layouts; the pipeline (PP8 VP4) is no longer refused either.
    assert build_plan("pretrain_qwen3", "235b_a22b", "fp8", 256, "h100").layout.describe() \
        == "TP2 PP8 CP1 DP16 EP32 VP4"
    assert build_plan("pretrain_qwen3", "30b_a3b", "fp8", 16, "h100").layout.describe() \
        == "TP1 PP1 CP1 DP16 EP16"
    # The BF16 GB200 row (TP1 PP8 VP3 EP32 over DP32) is a plan the engine runs.
    assert build_plan("pretrain_qwen3", "235b_a22b", "bf16", 256, "gb200").layout.describe() \
        == "TP1 PP8 CP1 DP32 EP32 VP3"
    # On a CPU torchao's FP8 grouped GEMM (Triton, torch._scaled_grouped_mm) cannot run:
    # one line, naming what does.
    with pytest.raises(PlanError) as err:
        build_plan("pretrain_qwen3", "tiny", "fp8", 2, "cpu")
    lines = err.value.problems if hasattr(err.value, "problems") else str(err.value).splitlines()
    assert len(lines) == 1 and "FP8 for MoE" in str(lines[0]) and "mxfp8" in str(lines[0])


def test_published_model_tflops_match_the_causal_count():
    # NVIDIA's "Model TFLOP / sec / GPU" over its tokens/s/GPU is the FLOPs per token of
    # Megatron-Bridge's formula (flop_utils.py: causal attention, active experts, router,
    # MLA projections, MTP layers when on). Rows stating "w/o MTP", and the Qwen3 rows, must
    # agree with trainbench's causal count within the tables' rounding (4 digits).
    checked = 0
    for r in HELD_OUT_MOE:
        if r.workload == "pretrain_deepseek_v3" and "5776a6d" not in r.source:
            continue  # MTP unstated there (their figure is 3.5-4% higher: one MTP layer)
        m = get_model(r.workload, r.size)
        published = r.tflops_per_gpu * 1e12 / r.tokens_per_s_per_gpu
        causal = fl.flops_per_sequence(m, r.seq_len, "causal") / r.seq_len
        assert causal == pytest.approx(published, rel=0.015), r.key
        # ... and not the non-causal count, 8-22% higher for these models.
        assert fl.flops_per_sequence(m, r.seq_len, "published") / r.seq_len > 1.07 * published
        checked += 1
    assert checked >= 12


def test_all_to_all_bytes_by_hand():
    # One microbatch of 4096 tokens, top-8, hidden 7168, bf16, EP8: each token sends 8 rows
    # of 7168 x 2 B, 7/8 of them to other ranks.
    assert moe_all_to_all_bytes(4096, 8, 7168, 2, 8) == 411_041_792
    assert moe_all_to_all_bytes(4096, 8, 7168, 2, 1) == 0
    dev = device_for("h100", 8)
    size = 1e9
    inside = all_to_all_s(size, Group(8, 1), dev)
    assert inside == pytest.approx(3 * dev.collective_latency_us * 1e-6
                                   + size / (dev.intra_node_busbw_gbs * 1e9))
    # EP16 over two nodes of 8: 7 of the 15 peers over NVLink, 8 through the NIC.
    across = all_to_all_s(size, Group(16, 1), dev)
    assert across == pytest.approx(4 * dev.collective_latency_us * 1e-6
                                   + max(size * 7 / 15 / (dev.intra_node_busbw_gbs * 1e9),
                                         size * 8 / 15 / (dev.network_gbs * 1e9)))
    assert latency_s(16, dev) == 4 * dev.collective_latency_us * 1e-6


def test_predicted_all_to_all_is_four_per_moe_layer_per_microbatch():
    # Qwen3 30B-A3B, 16 H100, EP16 PP1 (26.04.01 row): 48 MoE layers, GA = 1024 / 16.
    row = next(r for r in HELD_OUT_MOE if r.size == "30b_a3b" and r.gpu_type == "h100"
               and r.pp == 1)
    dev = device_for("h100", 8)
    per_step = (1024 // 16) * 48 * 4
    # The engine: one all_to_all_single row per chosen expert (top-8 of 4096 tokens, 2048
    # wide, bf16), 15/16 of them to other ranks.
    engine = predict_step(_plan(row), sharding="engine", constants=default_constants("h100"))
    one = 4096 * 8 * 2048 * 2 * 15 / 16
    assert engine.breakdown["ep_comm"] == pytest.approx(
        per_step * all_to_all_s(one, Group(16, 1), dev))
    # The published run (Megatron's flex dispatcher): each token crosses the NIC once if
    # any of its 8 experts is on the other node, 1 - (1/2)^8 of the time; its 8 rows cross
    # NVLink. 15 us x log2(16) of latency; 45 GB/s NIC, 370 GB/s NVLink (catalog.measured).
    published = predict_step(_plan(row), sharding="distributed_optimizer",
                             constants=default_constants("h100"))
    tokens = 4096 * 2048 * 2
    nic = tokens * (1 - 0.5 ** 8) / 45e9
    nvlink = tokens * 8 * 15 / 16 / 370e9
    assert nic > nvlink
    assert published.breakdown["ep_comm"] == pytest.approx(per_step * (4 * 15e-6 + nic))


def test_per_node_dispatch_matches_a_simulated_balanced_router():
    """The expected number of other nodes a token's top-k experts land on, against a
    simulation of a router that picks experts uniformly (seeded)."""
    import random
    rng = random.Random(0)
    dev = device_for("h100", 8)
    for ep, top_k in ((32, 8), (64, 8), (16, 2)):
        nodes = ep // 8
        draws = 20000
        reached = sum(len({rng.randrange(ep) // 8 for _ in range(top_k)} - {0})
                      for _ in range(draws)) / draws
        token_bytes = 1e9
        t = moe_dispatch_s(token_bytes, top_k, Group(ep, 1), dev, "per_node")
        nic_s = t - latency_s(ep, dev)
        assert nic_s * dev.network_gbs * 1e9 / token_bytes == pytest.approx(reached, rel=0.03)
        # Fewer bytes through the NIC than one row per remote expert.
        plain = moe_dispatch_s(token_bytes, top_k, Group(ep, 1), dev, "all_to_all")
        assert t < plain
        assert reached < top_k * (nodes - 1) / nodes
    with pytest.raises(ValueError, match="unknown MoE dispatch"):
        moe_dispatch_s(1e9, 8, Group(16, 1), dev, "ring")


def test_expert_gemms_slow_down_with_fewer_rows_per_expert():
    m = get_model("pretrain_qwen3", "30b_a3b")
    c = default_constants("h100")
    effs = []
    for ep in (1, 2, 4):  # 256, 512, 1024 rows per expert: below k and n
        sh = Shape(mbs=1, seq_len=4096, tp=1, cp=1, act_bytes=2, fp8=False, ep=ep)
        lw = layer_work(m, "moe", sh)
        up = next(x for x in lw.linears if x.name == "experts_up")
        # Balanced routing: 4096 x 8 rows over 128 / ep local experts.
        assert up.group_m == 4096 * 8 * ep // 128
        effs.append(gemm_efficiency(c, False, up))
        # Only this rank's experts are held: router, E/ep experts, norm.
        assert lw.params == 2048 * 128 + (128 // ep) * 3 * 2048 * 768 + 2048
    assert effs[0] < effs[1] < effs[2]


def test_predict_runs_on_every_published_moe_row():
    for row in HELD_OUT_MOE:
        pred = predict_step(_plan(row), sharding="distributed_optimizer",
                            constants=default_constants("h100"))
        assert math.isfinite(pred.step_time_s) and pred.step_time_s > 0, row.key
        assert pred.breakdown["ep_comm"] > 0, row.key
        assert pred.mfu < 1.0, row.key
        # Within a factor of two of the published step time: a sanity bound, not the
        # accuracy claim (bench/predict_accuracy.py reports that).
        assert 0.3 < pred.step_time_s / row.step_time_s < 2.0, row.key


def test_expert_optimizer_state_is_sharded_over_expert_data_ranks_only():
    # Qwen3 30B-A3B on 16 H100 at EP16 (26.04.01): each rank holds 8 of the 128 experts in
    # every one of the 48 layers, and no other rank holds them (16 / 16 = 1 expert-data
    # rank), so their fp32 master weights and moments (12 B each) are not divided; the rest
    # of the model is sharded over the 16 data ranks.
    row = next(r for r in HELD_OUT_MOE if r.size == "30b_a3b" and r.gpu_type == "h100"
               and r.pp == 1)
    plan = published_plan(row.workload, row.size, "bf16", row.gpus, row.gpu_type, tp=row.tp,
                          pp=row.pp, cp=row.cp, ep=row.ep, vp=row.vp, mbs=row.mbs,
                          gbs=row.gbs, seq_len=row.seq_len)  # bf16: no FP8 weight copies
    pred = predict_step(plan, sharding="distributed_optimizer",
                        constants=default_constants("h100"))
    expert = 48 * 8 * 3 * 2048 * 768
    total = pred.memory.weights / 2  # bf16 weights: every parameter this rank holds
    dense = total - expert
    assert pred.memory.optimizer == pytest.approx(12 * (dense / 16 + expert))
    # All 128 experts would be 16x the expert weights this rank holds.
    assert total < 48 * 128 * 3 * 2048 * 768 / 4


def test_the_qwen3_235b_h100_rows_ran_the_alltoall_dispatcher():
    """catalog.heldout's recipe fact: Megatron-Bridge's Qwen3 235B-A22B H100 rows (25.09 to
    26.04.01) dispatched with Megatron-Core's alltoall dispatcher; every other MoE row
    with the flex one."""
    from trainbench.catalog.heldout import moe_dispatcher
    alltoall = [r for r in HELD_OUT_MOE if moe_dispatcher(r) == "alltoall"]
    assert len(alltoall) == 4
    assert all(r.size == "235b_a22b" and r.gpu_type == "h100" for r in alltoall)
    assert {moe_dispatcher(r) for r in HELD_OUT_MOE if r not in alltoall} == {"flex"}


def test_the_alltoall_dispatcher_sends_a_row_per_chosen_expert():
    """Under MegatronRun(moe_dispatcher='alltoall') a Megatron run's four token exchanges
    of an MoE layer are comm's all-to-all of a row per chosen expert, where the flex
    dispatcher's are its per-node dispatch; the rest of the step is the same."""
    from trainbench.predict import comm, perf
    from trainbench.predict.context import MegatronRun, make_context
    row = next(r for r in HELD_OUT_MOE if r.size == "235b_a22b" and r.gpu_type == "h100")
    plan = _plan(row)
    times = {}
    for dispatcher, expected in (("flex", comm.PER_NODE), ("alltoall", comm.ALL_TO_ALL)):
        ctx = make_context(plan, sharding="distributed_optimizer",
                           megatron=MegatronRun(moe_dispatcher=dispatcher))
        assert ctx.ep_dispatch == expected
        lw = ctx.work["moe"]
        one = moe_dispatch_s(lw.ep_token_bytes, plan.model.top_k, ctx.groups.ep, ctx.device,
                             expected)
        times[dispatcher] = perf.layer_time(lw, ctx)
        assert times[dispatcher].ep_comm == pytest.approx(4 * one)
    flex, alltoall = times["flex"], times["alltoall"]
    assert alltoall.ep_comm > flex.ep_comm  # 8 rows a token against its remote nodes
    assert alltoall.compute == pytest.approx(flex.compute)
