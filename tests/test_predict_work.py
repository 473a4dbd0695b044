"""Per-GPU work of one layer (predict/work.py): FLOP splits, activations, parameters,
and how layers sit on pipeline stages."""

from dataclasses import replace

import pytest

from trainbench import flops as fl
from trainbench.catalog.models import get_model, parameter_count
from trainbench.predict.work import (
    Shape, block_kinds, layer_work, logits_bytes, pipeline_chunks, rank_chunks)

L8B = get_model("pretrain_llama3.1", "8b")
NH = get_model("pretrain_nemotronh", "56b")
N15 = get_model("pretrain_nemotron4", "15b")


def shape(m, tp=1, cp=1, mbs=1, fp8=False, seq=None):
    return Shape(mbs=mbs, seq_len=seq or m.seq_len, tp=tp, cp=cp, act_bytes=2, fp8=fp8)


@pytest.mark.parametrize("tp,cp,mbs", [(1, 1, 1), (4, 2, 1), (8, 1, 2)])
def test_layer_flops_split_adds_up_to_the_causal_convention(tp, cp, mbs):
    # flops.py causal convention (Megatron-LM, Narayanan et al. 2021), divided over TP x CP.
    sh = shape(L8B, tp, cp, mbs)
    att = layer_work(L8B, "attention", sh)
    total = fl.attention_layer_flops_causal(L8B, L8B.seq_len) * mbs / (tp * cp)
    assert att.gemm_flops + att.attn_flops == pytest.approx(total, rel=1e-12)
    mlp = layer_work(L8B, "mlp", sh)
    assert mlp.gemm_flops == pytest.approx(fl.mlp_layer_flops(L8B, L8B.seq_len) * mbs / (tp * cp))
    mamba = layer_work(NH, "mamba", shape(NH, 8, 1, mbs))
    assert mamba.gemm_flops + mamba.scan_flops == pytest.approx(
        fl.mamba_layer_flops(NH, NH.seq_len) * mbs / 8, rel=1e-12)
    head = layer_work(L8B, "head", sh)
    assert head.gemm_flops == pytest.approx(fl.flops_breakdown(L8B, None, "causal")["embedding"]
                                            * mbs / (tp * cp), rel=1e-12)


def test_linear_shapes_split_columns_then_rows():
    # Megatron-LM tensor parallelism (Shoeybi et al. 2019): QKV column-parallel, out row-parallel.
    att = layer_work(L8B, "attention", shape(L8B, tp=4, cp=2))
    qkv, out = att.linears
    assert (qkv.m, qkv.k, qkv.n) == (4096, 4096, (4096 + 2 * 1024) // 4)
    assert (out.m, out.k, out.n) == (4096, 1024, 4096)
    assert qkv.flops == 6.0 * 4096 * 4096 * 1536  # forward, dgrad, wgrad: 3 x 2mkn


def test_parameters_per_gpu_add_up_to_the_model():
    # Norm weights are replicated over TP; everything else is split.
    tp = 4
    sh = shape(L8B, tp=tp)
    per_gpu = sum(layer_work(L8B, k, sh).params * n for k, n in
                  (("attention", 32), ("mlp", 32), ("embedding", 1), ("head", 1)))
    norms = (2 * 32 + 1) * L8B.hidden
    assert (per_gpu - norms) * tp + norms == pytest.approx(parameter_count(L8B), rel=1e-9)
    nh = shape(NH, tp=1)
    counts = NH.layer_counts()
    total = sum(layer_work(NH, k, nh).params * counts.get(k, 1)
                for k in ("attention", "mlp", "mamba", "embedding", "head"))
    assert total == pytest.approx(parameter_count(NH), rel=1e-9)


def test_activations_match_korthikanti_without_dropout_and_with_flash_attention():
    # Korthikanti et al. 2022, Table 2: 34*s*b*h + 5*a*s^2*b bytes per layer; without the
    # three dropout masks (3sbh) and with flash attention (no s^2 terms): 32*s*b*h, plus the
    # softmax log-sum-exp. GPT shape: 4h MLP with one activation, no GQA, no TP.
    gpt = replace(N15, kv_heads=N15.heads, ffn=4 * N15.hidden)
    s, b, h = 4096, 2, gpt.hidden
    sh = shape(gpt, mbs=b, seq=s)
    per_layer = layer_work(gpt, "attention", sh).act_bytes + layer_work(gpt, "mlp", sh).act_bytes
    lse = gpt.heads * s * b * 4
    assert per_layer == pytest.approx(32 * s * b * h + lse, rel=1e-12)
    # With tensor + sequence parallelism t everything is divided by t (their Table 2, row 4).
    sh8 = shape(gpt, tp=8, mbs=b, seq=s)
    per_layer8 = (layer_work(gpt, "attention", sh8).act_bytes
                  + layer_work(gpt, "mlp", sh8).act_bytes)
    assert per_layer8 == pytest.approx(per_layer / 8, rel=1e-12)
    # Full recomputation keeps only the layer input: 2*s*b*h/t (hardware.md).
    assert layer_work(gpt, "attention", sh8).input_bytes == pytest.approx(2 * s * b * h / 8)


def test_fp8_keeps_gemm_inputs_in_one_byte():
    # Transformer Engine saves the FP8-cast input of each FP8 GEMM.
    bf16 = layer_work(L8B, "mlp", shape(L8B))
    fp8 = layer_work(L8B, "mlp", shape(L8B, fp8=True))
    tok = L8B.seq_len
    assert bf16.act_bytes - fp8.act_bytes == pytest.approx((L8B.hidden + L8B.ffn) * tok)


def test_fp8_casts_are_not_in_the_layers_memory_bound_traffic():
    # predict.fp8_cost charges them from the linears (tests/test_predict_fp8_moe.py).
    bf16 = layer_work(L8B, "mlp", shape(L8B))
    fp8 = layer_work(L8B, "mlp", shape(L8B, fp8=True))
    assert fp8.hbm_bytes == bf16.hbm_bytes


def test_ring_attention_sends_kv_cp_minus_one_times():
    # Ring attention (Liu et al. 2023): each rank forwards its K and V to the next, cp-1 times.
    cp = 4
    att = layer_work(L8B, "attention", shape(L8B, cp=cp))
    kv = 2 * L8B.kv_heads * L8B.head_dim * (L8B.seq_len // cp) * 2
    assert att.cp_kv_bytes == pytest.approx(kv * (cp - 1))
    assert layer_work(L8B, "attention", shape(L8B)).cp_kv_bytes == 0.0


def test_logits_memory_is_ten_bytes_per_logit():
    # bf16 logits + fp32 softmax + fp32 gradient (Megatron-LM vocab-parallel cross-entropy).
    assert logits_bytes(L8B, shape(L8B, cp=2)) == 10.0 * 4096 * L8B.vocab_size


def test_pipeline_split_counts_embedding_and_loss_when_layers_do_not_divide():
    # NeMo: 126 + 2 = 128 = PP8 x VP8 x 2 for Llama 3.1 405B.
    m = get_model("pretrain_llama3.1", "405b")
    chunks = pipeline_chunks(m, 8, 8)
    assert len(chunks) == 64
    assert chunks[0] == ["embedding", "attention", "mlp"]
    assert chunks[-1] == ["attention", "mlp", "head"]
    assert all(c.count("attention") == 2 for c in chunks[1:-1])
    assert sum(c.count("attention") for c in chunks) == 126
    even = pipeline_chunks(L8B, 4, 2)
    assert [c.count("attention") for c in even] == [4] * 8
    assert even[0][0] == "embedding" and even[-1][-1] == "head"
    hybrid = pipeline_chunks(NH, 2, 1)
    assert sum(len(c) for c in hybrid) == len(NH.pattern) + 2
    assert block_kinds(NH)[0] == ("mamba",)


def test_interleaved_ranks_hold_every_pp_th_stage():
    # Interleaved 1F1B (Narayanan et al. 2021): rank r holds virtual stages r, r+p, r+2p.
    chunks = [[str(i)] for i in range(8)]
    assert rank_chunks(chunks, 4) == [[["0"], ["4"]], [["1"], ["5"]], [["2"], ["6"]],
                                      [["3"], ["7"]]]


def test_memory_bound_traffic_per_layer():
    # Per token, forward + backward: a norm 5h and a residual add 4h (on tokens/tp with
    # sequence parallelism, Korthikanti et al. 2022), RoPE on q and k 4(q + kv), SwiGLU 8f,
    # squared ReLU 5f (element reads + writes, bf16).
    tp, tok, b, h = 2, L8B.seq_len, 2, L8B.hidden
    sh = shape(L8B, tp=tp)
    q, kv = L8B.heads * L8B.head_dim, L8B.kv_heads * L8B.head_dim
    att = layer_work(L8B, "attention", sh)
    assert att.hbm_bytes == pytest.approx((9 * h + 4 * (q + kv)) * tok / tp * b)
    mlp = layer_work(L8B, "mlp", sh)
    assert mlp.hbm_bytes == pytest.approx((9 * h + 8 * L8B.ffn) * tok / tp * b)
    relu = layer_work(N15, "mlp", shape(N15))
    assert relu.hbm_bytes == pytest.approx((9 * N15.hidden + 5 * N15.ffn) * N15.seq_len * b)
    # NoPE attention (Nemotron-H) has no RoPE traffic.
    nope = layer_work(NH, "attention", shape(NH))
    assert nope.hbm_bytes == pytest.approx(9 * NH.hidden * NH.seq_len * b)


def test_mamba_scan_moves_fp32_chunk_states_through_hbm():
    # SSD (Dao & Gu 2024): H x P x N states per chunk of Q tokens pass between the kernels:
    # 8 fp32 and 7 bf16 passes (test_the_ssd_scan_traffic_is_the_kernels_tally).
    sh = shape(NH, tp=8)
    mamba = layer_work(NH, "mamba", sh)
    states = (NH.mamba_heads / 8) * NH.mamba_head_dim * NH.mamba_state / NH.mamba_chunk
    assert mamba.scan_hbm_bytes > (8 * 4 + 7 * 2) * states * NH.seq_len
    small = replace(NH, mamba_state=16)
    assert layer_work(small, "mamba", sh).scan_hbm_bytes < mamba.scan_hbm_bytes
    # Kept: norm input and output, in_proj output (z, xBC, dt), scan output y, fp32 dt/dA.
    d, gn, H, h = NH.mamba_d_inner, NH.mamba_groups * NH.mamba_state, NH.mamba_heads, NH.hidden
    tok = NH.seq_len
    expected = (2 * h + 2 * d + 2 * gn + H + d) * tok / 8 * 2 + 2 * H / 8 * tok * 4
    assert mamba.act_bytes == pytest.approx(expected)


def test_te_fused_loss_moves_half_the_bytes_of_the_unfused_one():
    # Unfused: the GEMM writes bf16 logits, an fp32 softmax reads them, writes its fp32
    # gradient and casts it back (16 B per logit); TE's fused kernel reads the bf16 logits
    # once forward and once backward, writing the gradient in place (8 B with the write).
    sh = Shape(mbs=1, seq_len=8192, tp=2, cp=1, act_bytes=2, fp8=False)
    plain, fused = (layer_work(L8B, "head", s) for s in (sh, replace(sh, fused_loss=True)))
    assert plain.hbm_bytes - fused.hbm_bytes == pytest.approx(8 * 8192 * 128256 / 2)
    assert plain.linears == fused.linears  # the output GEMM is the same
    assert logits_bytes(L8B, replace(sh, fused_loss=True)) == pytest.approx(
        2 * 8192 * 128256 / 2)


def test_the_ssd_scan_traffic_is_the_kernels_tally():
    # mamba_ssm's Triton SSD kernels (state-spaces/mamba @e9594ce), as Megatron-LM calls
    # them (z gated inside the scan), tallied kernel by kernel at one TP8 rank of
    # Nemotron-H 56B (32 heads of 64, one group of state 256, chunks of 128, 8192 tokens,
    # bf16): forward 73,792 and backward 238,272 bytes per token.
    from trainbench.predict.work import ssd_scan_bytes
    sh = Shape(mbs=1, seq_len=8192, tp=8, cp=1, act_bytes=2, fp8=True)
    assert ssd_scan_bytes(NH, sh) == pytest.approx(73_792 + 238_272, rel=0.01)
    lw = layer_work(NH, "mamba", sh)
    assert lw.scan_hbm_bytes == pytest.approx(ssd_scan_bytes(NH, sh) * 8192)
    assert lw.scan_dim == 64  # the head dim: the matmuls' smallest side


@pytest.mark.parametrize("seq,chunked", [(8192, True), (512, False)])
def test_the_engines_loss_traffic_by_hand(seq, chunked):
    """engine/loss.py per logit, bf16 logits: the forward upcasts them (read 2, write 4)
    and takes their log-softmax (read 4, write 4); the backward zeroes the fp32 gradient
    (4), runs the log-softmax backward (read 4 + 4, write 4) and casts the gradient down
    (read 4, write 2). Chunked (more logits than one chunk's 2**27), each chunk is
    checkpointed: its backward upcasts and takes the log-softmax again, and the chunks'
    bf16 gradients are concatenated (read 2, write 2). The final norm's 5 B per hidden
    element of a token stays in the memory-bound traffic; the recipe's unfused loss is 16 B
    per logit there, with no upcast or streaming pass of its own."""
    sh = replace(shape(L8B, seq=seq), engine=True)
    logits = seq * L8B.vocab_size
    assert (logits > 2 ** 27) is chunked
    head = layer_work(L8B, "head", sh)
    norm = 5 * L8B.hidden * seq * 2
    forwards = 2 if chunked else 1
    assert head.hbm_bytes == pytest.approx(norm + (8 * forwards + 12) * logits)
    assert head.upcast_bytes == pytest.approx(6 * forwards * logits)
    assert head.stream_bytes == pytest.approx((4 + 6 + (4 if chunked else 0)) * logits)
    recipe = layer_work(L8B, "head", shape(L8B, seq=seq))
    assert recipe.hbm_bytes == pytest.approx(norm + 16 * logits)
    assert (recipe.upcast_bytes, recipe.stream_bytes) == (0.0, 0.0)


def test_an_fp32_loss_casts_nothing():
    sh = Shape(mbs=1, seq_len=512, tp=1, cp=1, act_bytes=4, fp8=False, engine=True)
    head = layer_work(L8B, "head", sh)
    assert head.upcast_bytes == 0.0
    assert head.stream_bytes == pytest.approx(4 * 512 * L8B.vocab_size)  # the zeroed gradient
