"""FP8 cast traffic (predict/fp8_cost.py) and MoE dispatch costs (predict/moe_cost.py),
each pinned to a count written out by hand from the kernels the module cites: bf16
elements are 2 B, FP8 ones 1 B."""

import math
from dataclasses import replace

import pytest

from trainbench.catalog.hardware import get_gpu
from trainbench.catalog.models import get_model
from trainbench.planning import build_plan
from trainbench.predict import fp8_cost, moe_cost
from trainbench.predict.constants import default_constants
from trainbench.predict.context import make_context
from trainbench.predict.perf import gemm_efficiency, predict_step
from trainbench.predict.work import Shape, layer_work

TENSORWISE = fp8_cost.Fp8Recipe(fp8_cost.TORCHAO, "tensorwise")
ROWWISE = fp8_cost.Fp8Recipe(fp8_cost.TORCHAO, "rowwise")
DELAYED = fp8_cost.Fp8Recipe(fp8_cost.TE, "delayed")
MXFP8 = fp8_cost.Fp8Recipe(fp8_cost.TE, "mxfp8")
M, K, N = 8192, 4096, 6144  # the 8B model's QKV projection on one GPU


def test_torchao_tensorwise_reads_each_tensor_once_for_its_scale():
    # Input: amax (read 2) + forward cast (read 2, write 1) + the backward's dim-1 cast
    # (read 2, write 1) = 8 B; the output gradient: amax + dim-0 and dim-1 casts = 8 B.
    expected = 8 * M * K + 8 * M * N
    assert fp8_cost.activation_bytes("qkv", M, K, N, TENSORWISE, 2) == expected


def test_torchao_rowwise_reduces_once_per_cast():
    # Two casts per tensor along different axes: 2 x (amax 2 + cast 3) = 10 B per element.
    expected = 10 * M * (K + N)
    assert fp8_cost.activation_bytes("qkv", M, K, N, ROWWISE, 2) == expected


def test_te_norm_fused_input_costs_only_its_transpose_under_delayed_scaling():
    # QKV's input comes out of the norm in FP8 (1 B instead of the bf16 2 B counted with the
    # norm) and a transpose kernel reads and writes 1 B each: +1 B; the output gradient's
    # cast-transpose reads 2 and writes 2.
    assert fp8_cost.activation_bytes("qkv", M, K, N, DELAYED, 2) == 1 * M * K + 4 * M * N
    # The output projection's input (attention's bf16 output) has its own cast-transpose.
    assert fp8_cost.activation_bytes("out", M, K, N, DELAYED, 2) == 4 * M * K + 4 * M * N


def test_te_current_scaling_quantises_after_the_norm():
    # No fused norm: amax (read 2), then cast-transpose (read 2, write 1 + 1) = 6 B for
    # every input and output gradient, QKV's included.
    current = fp8_cost.Fp8Recipe(fp8_cost.TE, "current")
    assert fp8_cost.activation_bytes("qkv", M, K, N, current, 2) == 6 * M * (K + N)


def test_te_mxfp8_writes_both_copies_with_a_scale_per_32():
    per = 2 + 2 * (1 + 1 / 32)
    assert fp8_cost.activation_bytes("out", M, K, N, MXFP8, 2) == pytest.approx(
        per * M * (K + N))


def test_te_casts_weights_once_a_step():
    # Read 2, write the FP8 weight and its transpose (2), shared by 16 microbatches.
    assert fp8_cost.weight_bytes(K, N, DELAYED, 2, microbatches=16) == 4 * K * N / 16


def test_torchao_weight_cast_per_microbatch_and_under_the_float8_all_gather():
    # Without the float8 all-gather the linear casts its weight like its input: 8 B.
    assert fp8_cost.weight_bytes(K, N, TENSORWISE, 2, microbatches=4) == 8 * K * N
    # With it: two eager shard casts a microbatch (fp32 copy 2+4, scale 4+4, clamp 4+4,
    # to FP8 4+1 = 27 B), one amax over the shard a step (2 B / 4 microbatches), shard 1/8.
    got = fp8_cost.weight_bytes(K, N, TENSORWISE, 2, microbatches=4, fsdp_float8_gathers=2,
                                fsdp_shard=8)
    assert got == pytest.approx((2 * 27 + 2 / 4) * K * N / 8)


def _proxy_context(dtype, layers=4, gbs=1):
    plan = build_plan("pretrain_llama3.1", "8b", dtype, 1, "h100",
                      overrides={"layers": layers, "tp": 1, "cp": 1, "pp": 1, "dp": 1,
                                 "mbs": 1, "gbs": gbs, "dp_sharding": "full"})
    return plan, make_context(plan, sharding="engine")


def test_engine_mlp_casts_on_one_h100_by_hand():
    # The 8B proxy's MLP as the engine runs FP8 on one GPU (FSDP float8 all-gather, fully
    # sharded: a forward and a backward gather, one microbatch): gate/up 4096 -> 28672, down
    # 14336 -> 4096, 8192 tokens. The weights' casts run eagerly before each gather, and
    # are charged with FSDP's copies (tests/test_predict_weight_passes.py): none here.
    _, ctx = _proxy_context("fp8")
    acts = 8 * 8192 * ((4096 + 28672) + (14336 + 4096))
    assert fp8_cost.layer_cast_bytes(ctx.work["mlp"].linears, ctx) == pytest.approx(acts)
    # The head and every bf16 plan cast nothing.
    assert fp8_cost.layer_cast_bytes(ctx.work["head"].linears, ctx) == 0.0
    _, bf16 = _proxy_context("bf16")
    assert fp8_cost.layer_cast_bytes(bf16.work["mlp"].linears, bf16) == 0.0


def test_casts_are_charged_at_the_memory_bound_rate():
    # FP8 and bf16 layers move the same bytes but for the casts, so the memory-bound time
    # grows by exactly the casts' bytes over the H100's HBM bandwidth times hbm_eff.
    plan, ctx = _proxy_context("fp8")
    _, bf16_ctx = _proxy_context("bf16")
    fp8 = predict_step(plan, sharding="engine")
    bf16 = predict_step(bf16_ctx.plan, sharding="engine")
    casts = sum(fp8_cost.layer_cast_bytes(ctx.work[k].linears, ctx) for k in ("attention", "mlp"))
    rate = get_gpu("h100").hbm_tbs * 1e12 * default_constants("h100").hbm_eff
    grown = fp8.compute_breakdown["memory_bound"] - bf16.compute_breakdown["memory_bound"]
    assert grown == pytest.approx(4 * casts / rate, rel=1e-9)


def test_fp8_expert_groups_are_padded_to_16_rows():
    assert moe_cost.padded_rows(100.5, fp8=True) == 112
    assert moe_cost.padded_rows(3, fp8=True) == 16
    assert moe_cost.padded_rows(128, fp8=True) == 128
    assert moe_cost.padded_rows(100.4, fp8=False) == 100


def test_permutation_bytes_by_hand():
    # 1000 tokens, 8000 routed copies, hidden 2048, bf16, EP 8 with 16 local experts:
    # forward permute (read + write a copy: 16000), sort and unsort by local expert
    # (2 x 16000), unpermute (read 8000 copies, write 1000 tokens); the backward the same.
    expected = 2 * (16000 + 32000 + 9000) * 2048 * 2
    assert moe_cost.permutation_bytes(1000, 8000, 2048, 2, 16, 8) == expected
    # One local expert (or no EP): nothing to sort; nor under the flex dispatcher, whose
    # dispatch kernel does the first permutation.
    assert moe_cost.permutation_bytes(1000, 8000, 2048, 2, 1, 8) == 2 * 25000 * 2048 * 2
    assert moe_cost.permutation_bytes(1000, 8000, 2048, 2, 16, 8,
                                      fused_dispatch=True) == 2 * 25000 * 2048 * 2


def test_moe_layer_rows_padding_router_and_permutation():
    # Qwen3 30B-A3B, TP1, EP8, MBS 1, FP8: 4096 tokens x top-8 = 32768 rows over 128
    # experts, 16 on this rank: 2048 rows each (already a multiple of 16).
    m = get_model("pretrain_qwen3", "30b_a3b")
    sh = Shape(mbs=1, seq_len=m.seq_len, tp=1, cp=1, act_bytes=2, fp8=True, ep=8)
    lw = layer_work(m, "moe", sh)
    experts = {x.name: x for x in lw.linears}
    tok = m.seq_len
    rows = tok * m.top_k
    per_expert = rows * 8 // m.n_routed_experts
    assert experts["experts_up"].group_m == per_expert == 2048
    assert experts["experts_up"].m == per_expert * (m.n_routed_experts // 8)
    h, f, E = m.hidden, m.moe_ffn, m.n_routed_experts
    norm_residual = 9.0 * h * tok
    # Megatron's flex dispatcher: permute (2 rows) and unpermute (rows + tokens), twice.
    hbm = ((norm_residual + 8.0 * f * rows) * 2 + 28.0 * tok * E
           + 2 * (2 * rows + rows + tok) * h * 2)
    assert lw.hbm_bytes == pytest.approx(hbm)
    # The engine's (the alltoall dispatcher's count): the chunk sort and its inverse too.
    engine = layer_work(m, "moe", replace(sh, engine=True))
    assert engine.hbm_bytes - lw.hbm_bytes == pytest.approx(2 * 4 * rows * h * 2, rel=1e-9)


def test_grouped_gemm_efficiency_falls_off_with_rows_per_expert():
    # A group of 16 rows: eff_fp8 x 16 / (16 + gemm_half_dim).
    c = default_constants("h100")
    m = get_model("pretrain_qwen3", "30b_a3b")
    sh = Shape(mbs=1, seq_len=64, tp=1, cp=1, act_bytes=2, fp8=True, ep=8)
    up = {x.name: x for x in layer_work(m, "moe", sh).linears}["experts_up"]
    rows = 64 * m.top_k * 8 / m.n_routed_experts  # 32 rows each
    assert up.group_m == 16 * math.ceil(rows / 16) == 32
    assert gemm_efficiency(c, True, up) == pytest.approx(
        c.gemm_eff_fp8 * 32 / (32 + c.gemm_half_dim))


def test_engine_experts_cast_rowwise_inside_the_grouped_gemm():
    # Qwen3 30B-A3B's expert up projection as the engine runs FP8 on 8 GPUs, EP8: torchao's
    # grouped GEMM quantises rowwise (10 B per element of input and output gradient) and
    # casts its bf16 weights itself, forward and backward (10 B per element), for each of
    # the rank's 16 experts; FSDP's float8 all-gather does not apply to them.
    plan = build_plan("pretrain_qwen3", "30b_a3b", "fp8", 8, "h100",
                      overrides={"tp": 1, "pp": 1, "cp": 1, "ep": 8, "dp": 8, "mbs": 1,
                                 "gbs": 8})
    ctx = make_context(plan, sharding="engine")
    up = {x.name: x for x in ctx.work["moe"].linears}["experts_up"]
    m = plan.model
    expected = 10 * up.m * (m.hidden + 2 * m.moe_ffn) + 16 * 10 * m.hidden * 2 * m.moe_ffn
    assert fp8_cost.layer_cast_bytes((up,), ctx) == pytest.approx(expected)


def test_fsdp_gathers_the_fp8_linears_weights_at_one_byte():
    # The 8B proxy, 4 layers, FP8 under the engine: each block's QKV, out, gate/up and down
    # weights go through FSDP's float8 all-gather; embedding, head and norms in bf16.
    from trainbench.predict import perf
    _, ctx = _proxy_context("fp8")
    times = {k: perf.layer_time(lw, ctx) for k, lw in ctx.work.items()}
    rt = perf.rank_time(ctx, 0, times)
    per_block = 4096 * 6144 + 4096 * 4096 + 4096 * 28672 + 14336 * 4096
    assert rt.float8_params == 4 * per_block
    # Rowwise scaling has no float8 all-gather: nothing is gathered in FP8.
    plan = build_plan("pretrain_llama3.1", "8b", "fp8", 1, "h100",
                      overrides={"layers": 4, "tp": 1, "cp": 1, "pp": 1, "dp": 1, "mbs": 1,
                                 "gbs": 1, "dp_sharding": "full", "fp8_recipe": "rowwise"})
    row_ctx = make_context(plan, sharding="engine")
    row_times = {k: perf.layer_time(lw, row_ctx) for k, lw in row_ctx.work.items()}
    assert perf.rank_time(row_ctx, 0, row_times).float8_params == 0.0
