"""The seeds' worked examples, reproduced to the digits they print."""

import pytest

from trainbench import flops, metrics
from trainbench.catalog.models import get_model


@pytest.mark.parametrize("workload,size,printed", [
    ("pretrain_llama3.1", "8b", "4.74e+14"),
    ("pretrain_llama2", "70b", "1.82e+15"),
    ("pretrain_nemotron4", "340b", "1.01e+16"),
    ("pretrain_nemotronh", "56b", "2.82e+15"),
])
def test_published_flops_match_seed_examples(workload, size, printed):
    value = flops.flops_per_sequence(get_model(workload, size), convention="published")
    assert f"{flops.round_sig(value, 3):.2e}" == printed


def test_nemotron4_15b_and_nemotronh_to_four_digits():
    n15 = flops.flops_per_sequence(get_model("pretrain_nemotron4", "15b"))
    assert f"{flops.round_sig(n15, 4) / 1e12:.1f}" == "434.5"  # seed: 434.5e12
    nh = flops.flops_per_sequence(get_model("pretrain_nemotronh", "56b"))
    assert f"{flops.round_sig(nh, 4):.3e}" == "2.816e+15"  # seed: 2.816e15


def test_seed_intermediate_terms():
    # Seed 002: attention 20,937,965,568; mlp 33,822,867,456; embedding 3,152,019,456 (per token).
    parts = flops.flops_breakdown(get_model("pretrain_llama3.1", "8b"))
    assert parts["attention"] / 8192 == pytest.approx(20_937_965_568)
    assert parts["mlp"] / 8192 == 33_822_867_456
    assert parts["embedding"] / 8192 == 3_152_019_456
    # Seed 004: mamba_block_flops 199,690,209,460,224 and lm_head 8,796,093,022,208 (before x6).
    nh = flops.flops_breakdown(get_model("pretrain_nemotronh", "56b"))
    assert nh["mamba"] / 6 == 199_690_209_460_224
    assert nh["embedding"] / 6 == 8_796_093_022_208
    assert nh["mlp"] / 6 == 237_494_511_599_616
    assert nh["attention"] / 6 == 23_364_622_090_240


@pytest.mark.parametrize("gbs,f,t,gpus,peak,printed", [
    (128, 4.74e14, 12.39, 8, 1979, "30.93"),    # Llama 3.1 8B FP8, seed 002
    (128, 1.82e15, 7.908, 64, 989, "46.54"),    # Llama 2 70B BF16, seed 001
    (32, 1.01e16, 4.77, 128, 989, "53.52"),     # Nemotron-4 340B BF16, seed 000
    (256, 434.5e12, 2.693, 64, 989, "65.26"),   # Nemotron-4 15B BF16, seed 003
    (768, 2.816e15, 15.892, 256, 1979, "26.86"),  # Nemotron-H 56B FP8, seed 004
])
def test_mfu_examples(gbs, f, t, gpus, peak, printed):
    assert f"{100 * metrics.mfu(gbs, f, t, gpus, peak):.2f}" == printed


@pytest.mark.parametrize("seq,gbs,t,tokens,days", [
    (8192, 128, 12.39, "84631", "136.76"),
    (4096, 128, 7.908, "66298.43", "174.57"),
    (4096, 256, 3.59, "292082", "39.6"),
    (4096, 256, 2.693, "389371", "29.7"),
    (8192, 768, 15.892, "395888", "29.24"),
])
def test_tokens_and_days_examples(seq, gbs, t, tokens, days):
    tps = metrics.tokens_per_second(seq, gbs, t)
    decimals = len(tokens.split(".")[1]) if "." in tokens else 0
    assert f"{tps:.{decimals}f}" == tokens
    d = metrics.days_to_train(tps)
    # The seeds truncate or round the last digit (174.575... prints as 174.57).
    assert abs(d - float(days)) < 10 ** -len(days.split(".")[1])


def test_causal_convention_is_megatron_formula():
    m = get_model("pretrain_llama3.1", "70b")
    s, L, h, V, g, n = 8192, m.layers, m.hidden, m.vocab_size, m.kv_heads, m.heads
    megatron = 12 * s * L * h**2 * (1 + g / n + s / (2 * h)) + 6 * s * L * h * m.ffn * 3 + 6 * s * h * V
    assert flops.flops_per_sequence(m, convention="causal") == pytest.approx(megatron, rel=1e-12)
    assert flops.flops_per_sequence(m, convention="causal") < flops.flops_per_sequence(m)


def test_unknown_convention_is_refused():
    with pytest.raises(ValueError, match="unknown FLOPs convention"):
        flops.flops_per_sequence(get_model("pretrain_llama3.1", "8b"), convention="magic")


def test_default_window_is_seed_window_for_50_steps_and_scales():
    assert metrics.default_window(50) == (11, 44)
    assert metrics.default_window(100) == (22, 88)
    assert metrics.default_window(1) == (0, 0)
    start, end = metrics.default_window(5)
    assert 0 <= start <= end <= 4


def test_window_stats_by_hand():
    times = {i: float(i) for i in range(50)}
    st = metrics.window_stats(times, (11, 44))
    values = list(range(11, 45))
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    assert st.count == 34 and st.mean == pytest.approx(mean) and st.std == pytest.approx(var ** 0.5)
    assert (st.min, st.max) == (11, 44)
    assert metrics.window_stats(times, (60, 70)) is None


def megatron_dense_causal(s, L, h, n, g, ffn, vocab, gated):
    """architectures.md's causal formula, one sequence: 12*s*L*h^2*(1 + g/n + s/(2h)) for
    attention (q projection h x h), 6*s*L*h*ffn*(3 if SwiGLU else 2), 6*s*h*V for the head."""
    return (12 * s * L * h * h * (1 + g / n + s / (2 * h)) + 6 * s * L * h * ffn * (3 if gated else 2)
            + 6 * s * h * vocab)


@pytest.mark.parametrize("size,s,L,h,n,ffn", [
    ("15b", 4096, 32, 6144, 48, 24576),    # head dim 128: n x d = 6144 = h
    ("340b", 4096, 96, 18432, 96, 73728),  # head dim 192: n x d = 18432 = h
])
def test_nemotron4_causal_flops_against_a_hand_count(size, s, L, h, n, ffn):
    # Squared-ReLU MLP (up, down), 8 KV heads, vocab 256000 (architectures.md).
    expected = megatron_dense_causal(s, L, h, n, 8, ffn, 256000, gated=False)
    got = flops.flops_per_sequence(get_model("pretrain_nemotron4", size), convention="causal")
    assert got == pytest.approx(expected, rel=1e-12)


def test_nemotronh_causal_flops_against_a_hand_count():
    # architectures.md, Nemotron-H 56B; each layer kind counted on its own, fwd + bwd = 3 x
    # forward, 2 FLOPs per multiply-add, so 6 x the multiply-adds per token, times s tokens.
    s, h, vocab = 8192, 8192, 131072
    n_mamba, n_attn, n_mlp = 54, 10, 54
    # Attention: q and o h x (64 x 128 = h), k and v h x (8 x 128); scores QK^T and AV,
    # 2 x s x h multiply-adds per token, halved by the causal mask.
    attn = 6 * s * (2 * h * h + 2 * h * 8 * 128 + s * h)
    mlp = 6 * s * 2 * h * 32768  # squared ReLU: up and down, no gate
    # Mamba-2: d_inner 16384 = 256 heads x 64, N 256, 8 groups, conv kernel 4, chunk 128.
    H, P, N, G, Q = 256, 64, 256, 8, 128
    d_inner = H * P
    in_proj = h * (2 * d_inner + 2 * G * N + H)  # z, x, B, C, dt
    out_proj = d_inner * h
    conv = (d_inner + 2 * G * N) * 4  # depthwise over x, B, C
    # SSD per token and head: C.B^T and its product with X over the earlier positions of
    # the chunk (causal: Q/2 of them on average), the chunk state B (x) X and the output
    # from the carried state (N x P each).
    scan = H * (Q / 2 * (N + P) + 2 * N * P)
    mamba = 6 * s * (in_proj + out_proj + conv + scan)
    expected = n_attn * attn + n_mlp * mlp + n_mamba * mamba + 6 * s * h * vocab
    model = get_model("pretrain_nemotronh", "56b")
    assert model.layer_counts()["mamba"] == n_mamba and model.layer_counts()["mlp"] == n_mlp
    got = flops.flops_per_sequence(model, convention="causal")
    assert got == pytest.approx(expected, rel=1e-12)
