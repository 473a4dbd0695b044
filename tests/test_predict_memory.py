"""The memory model against the seeds' statements and its own formulas."""

import pytest

from trainbench.catalog.models import parameter_count
from trainbench.planning import build_plan
from trainbench.predict.device import GIB
from trainbench.predict.memory import (activations_in_flight, fits, in_flight_chunks,
                                       predict_memory, tensor_bytes)


def plan(workload, size, dtype, scale, **overrides):
    return build_plan(workload, size, dtype, scale, "h100", overrides=overrides)


def test_llama31_8b_at_8_gpus_matches_the_seed_log_line():
    # Seed 002's log line (Llama 3.1 8B, 8 GPUs): peak_memory_usage 70833405952,
    # memory_allocated 44271689728 bytes.
    m = predict_memory(plan("pretrain_llama3.1", "8b", "bf16", 8))
    assert m.fits
    assert m.total == pytest.approx(70833405952, rel=0.03)  # stated tolerance: 3%
    # Between steps only model state is allocated: bf16 weights and gradients (2 + 2 B) and
    # the fp32 master copy and Adam moments (12 B) over DP x CP = 8 (distributed optimizer).
    assert m.weights + m.gradients + m.optimizer == pytest.approx(44271689728, rel=0.01)


def test_nemotron4_15b_at_64_gpus_matches_the_seed_log_line():
    # Seed 003's log line (GBS 256: 15B on 64 GPUs): peak 72972500992, allocated 34466545664.
    m = predict_memory(plan("pretrain_nemotron4", "15b", "bf16", 64))
    assert m.fits
    assert m.total == pytest.approx(72972500992, rel=0.05)  # stated tolerance: 5%
    assert m.weights + m.gradients + m.optimizer == pytest.approx(34466545664, rel=0.02)


def test_405b_does_not_fit_below_its_minimum_scale():
    # Seed 002: 405B runs from 512 GPUs (TP8 PP8 CP2 VP8); the same layout on fewer GPUs
    # (smaller DP, so less sharded optimizer state) must not fit an 80 GB H100.
    assert predict_memory(plan("pretrain_llama3.1", "405b", "bf16", 512)).fits
    for scale, gbs in ((256, 128), (128, 64)):
        m = predict_memory(plan("pretrain_llama3.1", "405b", "bf16", scale,
                                tp=8, pp=8, cp=2, vp=8, gbs=gbs))
        assert not m.fits, scale
    # And its proxies fit where the seed runs them.
    assert predict_memory(plan("pretrain_llama3.1", "405b-proxy", "bf16", 32)).fits


@pytest.mark.parametrize("workload,size,dtype,scale", [
    ("pretrain_llama3.1", "70b", "bf16", 64), ("pretrain_llama3.1", "70b", "fp8", 64),
    ("pretrain_llama3.1", "405b", "fp8", 512), ("pretrain_nemotron4", "15b", "fp8", 16),
    ("pretrain_nemotronh", "56b", "fp8", 32)])
def test_seed_runs_fit_at_their_smallest_scale(workload, size, dtype, scale):
    assert predict_memory(plan(workload, size, dtype, scale)).fits


def test_maxtext_llama2_needs_recomputation():
    # 70B at MBS 2 x 4096 tokens without recomputation keeps ~170 GiB of activations,
    # which is why the recipe rows carry MaxText's recomputation.
    assert not predict_memory(plan("pretrain_llama2", "70b", "bf16", 64, recompute="none")).fits
    default = plan("pretrain_llama2", "70b", "bf16", 64)
    assert default.recompute == "full" and predict_memory(default).fits


def test_model_state_bytes_per_parameter():
    # ZeRO (Rajbhandari et al. 2020): mixed-precision Adam 2 + 2 + 12 B per parameter;
    # the distributed optimizer divides the 12 B by DP x CP, FSDP divides all 16 B.
    p = plan("pretrain_llama3.1", "8b", "bf16", 8)
    n = parameter_count(p.model)
    dist = predict_memory(p, sharding="distributed_optimizer")
    assert dist.weights == pytest.approx(2 * n) and dist.gradients == pytest.approx(2 * n)
    assert dist.optimizer == pytest.approx(12 * n / 8)
    fsdp = predict_memory(p, sharding="fsdp")
    assert fsdp.weights + fsdp.gradients + fsdp.optimizer == pytest.approx(16 * n / 8)
    assert fsdp.transient > 0  # gathered layers


def test_in_flight_microbatches_follow_the_schedules():
    # 1F1B: stage r holds p - r microbatches (Narayanan et al. 2021); interleaved: Megatron's
    # warm-up (p - r - 1) * 2 + (v - 1) * p chunks, plus the running one.
    assert in_flight_chunks(1, 1, 0, 32) == 1
    assert in_flight_chunks(8, 1, 0, 16) == 8 and in_flight_chunks(8, 1, 7, 16) == 1
    assert in_flight_chunks(8, 1, 0, 4) == 4
    assert in_flight_chunks(4, 5, 0, 64) == 3 * 2 + 4 * 4 + 1
    # About L * (1 + (p-1)/(p*v)) layers' worth on the first stage (Korthikanti et al. 2022).
    p, v, layers = 8, 8, 128
    per_chunk = layers // (p * v)
    assert in_flight_chunks(p, v, 0, 64) * per_chunk == pytest.approx(
        layers * (1 + (p - 1) / (p * v)), rel=0.02)


def test_activations_in_flight_count_each_virtual_stages_forwards():
    """PP2 x VP2, rank 0, 4 microbatches, its two virtual stages keeping 1 and 10 bytes a
    microbatch. Forwards run stages 0, 0, 1, 1, 0, 0, 1, 1 (rounds of pp microbatches),
    backwards free stages 1, 1, 0, 0, ...; the warm-up is 4 forwards, so at the first
    backward microbatches 0 and 1 are held at both stages and microbatch 2 at stage 0:
    2 x 1 + 2 x 10 + 1 = 23 bytes (the largest stage and 4 at the mean: 32). No later
    moment holds more: forward 7 (stage 1) comes after stage 1's backwards of 0 and 1."""
    assert activations_in_flight([1.0, 10.0], 2, 2, 0, 4) == 23.0
    # One virtual stage: the forwards in flight times the stage's bytes.
    assert activations_in_flight([3.0], 8, 1, 2, 16) == 3.0 * in_flight_chunks(8, 1, 2, 16)
    assert activations_in_flight([3.0], 1, 1, 0, 16) == 3.0
    # Equal virtual stages: in flight times one stage, the count the schedule gives.
    assert activations_in_flight([2.0] * 5, 4, 5, 0, 64) == 2.0 * in_flight_chunks(4, 5, 0, 64)


def test_recomputation_shrinks_activations():
    base = predict_memory(plan("pretrain_llama3.1", "70b", "bf16", 64))
    sel = predict_memory(plan("pretrain_llama3.1", "70b", "bf16", 64, recompute="selective"))
    full = predict_memory(plan("pretrain_llama3.1", "70b", "bf16", 64, recompute="full"))
    assert full.activations < sel.activations < base.activations
    assert full.activations < 0.1 * base.activations


def test_fits_verdict_for_trainbench_run():
    ok, why = fits(plan("pretrain_llama3.1", "8b", "bf16", 8))
    assert ok and "GiB" in why
    ok, why = fits(plan("pretrain_llama3.1", "405b", "bf16", 128, tp=8, pp=8, cp=2, vp=8, gbs=64,
                        recompute="none", dp_shard=1))
    assert not ok and "exceeds" in why
    cpu = build_plan("pretrain_llama3.1", "tiny", "fp32", 1, "cpu")
    ok, why = fits(cpu)
    assert ok and "no memory limit" in why


def test_tensor_bytes_of_a_tiny_cpu_run():
    # What a tiny CPU run's allocator should report (the engine test compares within 25%).
    p = build_plan("pretrain_llama3.1", "tiny", "fp32", 1, "cpu")
    n = parameter_count(p.model)
    b = tensor_bytes(p)
    m = predict_memory(p, sharding="fsdp")
    assert m.capacity is None and m.fits is None
    assert b == pytest.approx(m.total - m.allowance)
    assert b > 16 * n  # fp32 weights, gradients and Adam moments, plus activations
    assert b < 1 * GIB


def test_fp8_weight_cache_allowance_and_capacity():
    from trainbench.predict.constants import Constants
    from trainbench.predict.context import make_context
    from trainbench.predict.memory import FP8_WEIGHT_CACHE_BYTES, rank_memory
    bf16 = predict_memory(plan("pretrain_llama3.1", "8b", "bf16", 8))
    fp8 = predict_memory(plan("pretrain_llama3.1", "8b", "fp8", 8))
    m = plan("pretrain_llama3.1", "8b", "bf16", 8).model
    linear = m.layers * (m.hidden * (m.heads + 2 * m.kv_heads) * m.head_dim
                         + m.heads * m.head_dim * m.hidden + 3 * m.hidden * m.ffn)
    # Transformer Engine keeps one FP8 copy of each FP8 weight across microbatches.
    assert fp8.weights - bf16.weights == pytest.approx(FP8_WEIGHT_CACHE_BYTES * linear)
    # Allowance: fragmentation on activations and logits, plus fixed buffers.
    c = Constants()
    assert bf16.allowance == pytest.approx(
        c.fragmentation * (bf16.activations + bf16.logits) + c.buffers_gib * GIB)
    # Usable: 99.5% of the nominal size (81559 MiB of an 80 GB H100) less the CUDA context.
    assert bf16.capacity == pytest.approx((80 * 0.995 - c.context_gib) * GIB)
    ctx = make_context(plan("pretrain_llama3.1", "70b", "bf16", 64))
    last = rank_memory(ctx, 3)
    assert last.logits > 0 and rank_memory(ctx, 0).logits == 0  # only the last stage has them


def test_engine_loss_memory_follows_its_chunked_loss():
    """Llama 3.1 8B on 8 GPUs: TP1 CP2, MBS 1, seq 8192, so 4,096 tokens a rank, vocabulary
    128,256, bf16: 525.3M logits. The recipe's vocabulary-parallel loss holds 10 B per
    logit: 4.89 GiB. The engine's chunked loss (TP1) holds the bf16 logits and their bf16
    gradient (4 B per logit: 1.96 GiB) and one chunk's fp32 copy, softmax and gradient
    (3 x 4 B x 2^27 = 1.5 GiB): 3.46 GiB."""
    from trainbench.engine.loss import CHUNK_ELEMENTS
    from trainbench.predict.work import LOSS_CHUNK_ELEMENTS
    assert LOSS_CHUNK_ELEMENTS == CHUNK_ELEMENTS  # predict stays torch-free: a copy, checked
    p = plan("pretrain_llama3.1", "8b", "bf16", 8)
    assert (p.layout.tp, p.layout.cp, p.mbs, p.seq_len, p.model.vocab_size) == (
        1, 2, 1, 8192, 128256)
    recipe = predict_memory(p, sharding="recipe")
    engine = predict_memory(p, sharding="engine")
    assert recipe.logits / GIB == pytest.approx(4.89, abs=0.01)
    assert engine.logits / GIB == pytest.approx(1.96 + 1.5, abs=0.01)
    # Under TP the engine's loss is vocabulary-parallel, as the recipe's, and chunked over
    # the rank's half of the vocabulary: 8,192 tokens x 64,128 words, the same 525.3M
    # logits a rank.
    tp2 = plan("pretrain_llama3.1", "8b", "bf16", 8, tp=2, cp=1, dp=4)
    assert predict_memory(tp2, sharding="recipe").logits / GIB == pytest.approx(4.89, abs=0.01)
    assert predict_memory(tp2, sharding="engine").logits / GIB == pytest.approx(
        1.96 + 1.5, abs=0.01)


@pytest.mark.parametrize("sharding", ["distributed_optimizer", "fsdp", "recipe"])
def test_megatron_memory_says_it_charges_the_unfused_loss_and_no_offload(sharding):
    # NVIDIA's current recipes hold less than these figures (TE's fused loss, activation
    # offload): every Megatron-mode figure says what it leaves out; the engine's does not.
    plan = build_plan("pretrain_llama3.1", "70b", "fp8", 64, "gb300",
                      overrides={"tp": 1, "pp": 1, "cp": 1, "vp": 1, "mbs": 2, "gbs": 256})
    megatron = predict_memory(plan, sharding=sharding)
    assert "unfused cross entropy (10 B per logit)" in megatron.assumption
    assert "no activation offload" in megatron.assumption
    assert "unfused" not in predict_memory(plan, sharding="engine").assumption
    # The figure it names is the one charged: 10 B per logit of MBS 2 x 8192 tokens.
    assert megatron.logits == pytest.approx(10 * 2 * 8192 * 128256)


def _gb300_fsdp_row():
    # Megatron-Bridge 26.02's Llama 3 70B FP8-CS row on 64 GB300 (docs/performance-summary.md
    # @c0b9a00): FSDP, TP1 PP1 CP1, MBS 2, GBS 256; its recipe offloaded 20 layers
    # (llama3_workload_base_configs.py, v0.3.0) and fused the loss in TE.
    return build_plan("pretrain_llama3.1", "70b", "fp8", 64, "gb300",
                      overrides={"tp": 1, "pp": 1, "cp": 1, "vp": 1, "mbs": 2, "gbs": 256})


def test_te_fused_loss_keeps_two_bytes_per_logit_and_says_so():
    from trainbench.predict.context import MegatronRun
    p = _gb300_fsdp_row()
    fused = predict_memory(p, sharding="fsdp", megatron=MegatronRun(fused_loss=True))
    # TE's kernel saves the bf16 logits and writes their gradient in place: 2 B per logit of
    # MBS 2 x 8192 tokens x 128256 words.
    assert fused.logits == pytest.approx(2 * 2 * 8192 * 128256)
    assert "Transformer Engine's fused cross entropy" in fused.assumption
    assert "unfused" not in fused.assumption
    # Nothing else moves.
    plain = predict_memory(p, sharding="fsdp")
    assert fused.activations == plain.activations and fused.weights == plain.weights


def test_offloaded_layers_take_their_activations_off_the_gpu():
    from trainbench.predict.context import MegatronRun
    p = _gb300_fsdp_row()
    act = {n: predict_memory(p, sharding="fsdp", megatron=MegatronRun(offload_layers=n))
           .activations for n in (0, 20, 40)}
    # 80 identical blocks: each offloaded layer removes the same bytes...
    assert act[0] - act[20] == pytest.approx(act[20] - act[40])
    # ...and 40 of them a little under half the activations (the head's stay on the GPU).
    assert 0.45 * act[0] < act[0] - act[40] < 0.5 * act[0]
    m = predict_memory(p, sharding="fsdp", megatron=MegatronRun(offload_layers=20))
    assert "first 20 layers in host memory" in m.assumption


def test_the_published_gb300_run_fits_only_as_it_ran():
    # It ran, so it fits in GB300's memory. Megatron's unfused loss and no offload (what
    # predict charges without the run's settings) put it well over.
    from trainbench.predict.context import MegatronRun
    from trainbench.predict.perf import predict_step
    p = _gb300_fsdp_row()
    plain = predict_step(p, sharding="fsdp").memory
    as_ran = predict_step(p, sharding="fsdp",
                          megatron=MegatronRun(fused_loss=True, offload_layers=20)).memory
    assert plain.fits is False and as_ran.fits is True


@pytest.mark.parametrize("kwargs,sharding,message", [
    (dict(fused_loss=True), "engine", "trainbench's engine does not have"),
    (dict(offload_layers=80), "fsdp", r"fewer layers than the model has \(80\)"),
    (dict(offload_layers=-1), "fsdp", "must be 0 or more"),
])
def test_megatron_run_settings_that_cannot_describe_the_plan_are_refused(kwargs, sharding,
                                                                         message):
    from trainbench.predict.context import MegatronRun
    with pytest.raises(ValueError, match=message):
        predict_memory(_gb300_fsdp_row(), sharding=sharding, megatron=MegatronRun(**kwargs))


def test_offload_is_refused_under_pipeline_parallelism():
    from trainbench.predict.context import MegatronRun
    pp = plan("pretrain_llama3.1", "70b", "bf16", 64)  # the seed layout: PP4
    assert pp.layout.pp > 1
    with pytest.raises(ValueError, match="PP1 only"):
        predict_memory(pp, sharding="recipe", megatron=MegatronRun(offload_layers=4))


def test_mla_keeps_its_latents_and_the_out_projections_input_by_hand():
    """DeepSeek-V3 671B at TP2 with sequence parallelism, one 4,096-token microbatch,
    selective (up-projection) recompute: an MLA layer keeps, per microbatch, the norm's
    input and its output's sequence shard (7168 x 2048 bf16 each), the latents on the
    whole sequence (q's before and after its norm 2 x 1536, kv's 2 x 512, the RoPE key 64;
    bf16), and the out projection's input, this rank's 64 heads x v_head_dim 128: its FP8
    copy in the eager engine, bf16 in the compiled one; Megatron's recompute discards that
    output and its FP8 out projection keeps an FP8 copy, beside an FP8 norm output."""
    from trainbench.predict.context import make_context
    from trainbench.predict.memory import _kept
    over = {"layers": 4, "pp": 1, "vp": 1, "tp": 2, "ep": 64}
    norm = 7168 * 2048
    latents = (2 * 1536 + 2 * 512 + 64) * 4096 * 2
    out = 64 * 128 * 4096
    for compile_, out_bytes in ((False, 1), (True, 2)):
        p = build_plan("pretrain_deepseek_v3", "671b", "fp8", 128, "h100",
                       overrides={**over, "compile": compile_})
        engine = make_context(p, sharding="engine")
        assert _kept(engine, "attention", "selective") == 2 * 2 * norm + latents + out * out_bytes
    recipe = make_context(p, sharding="recipe")
    assert _kept(recipe, "attention", "selective") == (2 + 1) * norm + latents + out * 1


@pytest.mark.parametrize("dtype,state_bytes", [("bf16", 4.0), ("fp8", 6.0)])
def test_the_340b_seed_runs_apex_adam_with_bf16_state(dtype, state_bytes):
    """Seed 000's Nemotron-4 340B runs (NeMo 1.x, catalog.recipes.APEX_BF16_ADAM_RECIPES)
    kept Apex's DistributedFusedAdam state in bf16: the two moments (4 B a parameter) and,
    in FP8 (fp8_params), a bf16 master shard (2 B), sharded over DP, against
    Megatron-Core's fp32 master weights and moments (12 B). Under fp8_params each FP8
    layer's weight is its 1 B FP8 tensor; Megatron-Core keeps the bf16 weight and an FP8
    copy (2 + 1 B). The same plan run with Megatron-Core's optimizer is the comparison."""
    from dataclasses import replace

    from trainbench.catalog import recipes
    from trainbench.predict.perf import predict_step
    plan = build_plan("pretrain_nemotron4", "340b", dtype, 128, "h100")
    assert plan.recipe_source == recipes.SEED_NEMOTRON4_340B_OLD and plan.layout.dp == 2
    apex = predict_step(plan, sharding="recipe").memory
    assert plan.adam_moments == "bf16"  # the engine's plan for the row keeps them so too
    core = predict_step(replace(plan, recipe_source="--set", adam_moments="fp32"),
                        sharding="distributed_optimizer").memory
    params = core.gradients / 2  # bf16 gradients: every parameter this rank holds
    assert apex.gradients == pytest.approx(core.gradients)
    assert apex.optimizer == pytest.approx(core.optimizer * state_bytes / 12)
    fp8_layer_params = core.weights - 2 * params  # the FP8 copies, 1 B each
    assert (fp8_layer_params > 0) is (dtype == "fp8")
    assert apex.weights == pytest.approx(2 * (params - fp8_layer_params) + fp8_layer_params)
    assert apex.activations == pytest.approx(core.activations)
    assert apex.total_gib < 78.8 < core.total_gib  # fits the H100 it ran on
