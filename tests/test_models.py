"""The transformer models (engine/models/transformer.py) against independent references.

References: Hugging Face `LlamaForCausalLM` (eager attention) with the same weights, the
RoPE scaling formula of architectures.md written out here, F.layer_norm, and the
catalog's closed-form parameter counts.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from helpers import assert_every_parameter_trained
from trainbench.catalog.models import MODELS, ModelSpec, get_model, parameter_count
from trainbench.engine.models import build_model, count_parameters_meta
from trainbench.engine.models.transformer import (
    LayerNorm1p,
    Transformer,
    apply_rotary,
    rope_cos_sin,
    rope_frequencies,
)

# fp32 forward of a 2-3 layer model: differences come only from summation order. The README
# promises logits equal to 1e-5: the largest absolute difference, with no relative slack.
PARITY_MAX_ABS = 1e-5

LLAMA3_HF_ROPE = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def tiny_llama_spec(rope_base: float, rope_scaling: str | None, layers: int) -> ModelSpec:
    return ModelSpec(
        family="llama", name="parity", vocab_size=512, hidden=64, ffn=192, layers=layers,
        heads=4, kv_heads=2, head_dim=16, seq_len=128, rope_base=rope_base,
        rope_scaling=rope_scaling)


def hf_llama(spec: ModelSpec) -> torch.nn.Module:
    """A Hugging Face Llama of the spec's shape, HF's own random init, fp32, eager attention.
    Only the tests that compare with Hugging Face skip without transformers."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden, intermediate_size=spec.ffn,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim,
        rope_theta=spec.rope_base,
        rope_scaling=LLAMA3_HF_ROPE if spec.rope_scaling == "llama3" else None,
        max_position_embeddings=131072, rms_norm_eps=spec.norm_eps,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        # Larger than HF's 0.02 so attention is peaky and RoPE mistakes show in the logits.
        initializer_range=0.2, attn_implementation="eager")
    return transformers.LlamaForCausalLM(config).float().eval()


def copy_hf_weights(hf: torch.nn.Module, ours: Transformer) -> None:
    """Load HF Llama weights into trainbench's names."""
    sd = hf.state_dict()
    mapped = {
        "tok_embeddings.weight": sd["model.embed_tokens.weight"],
        "norm.weight": sd["model.norm.weight"],
        "output.weight": sd["lm_head.weight"],
    }
    names = {
        "attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj",
        "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj",
        "mlp.w1": "mlp.gate_proj", "mlp.w3": "mlp.up_proj", "mlp.w2": "mlp.down_proj",
        "attention_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
    }
    for i in range(len(ours.layers)):
        for our_name, hf_name in names.items():
            mapped[f"layers.{i}.{our_name}.weight"] = sd[f"model.layers.{i}.{hf_name}.weight"]
    ours.load_state_dict(mapped, strict=True)


def logits_pair(spec: ModelSpec, ours_spec: ModelSpec | None = None, seq: int = 96):
    torch.manual_seed(0)
    hf = hf_llama(spec)
    ours = Transformer(ours_spec or spec).eval()
    copy_hf_weights(hf, ours)
    tokens = torch.randint(0, spec.vocab_size, (2, seq))
    with torch.no_grad():
        return hf(input_ids=tokens).logits, ours(tokens)


@pytest.mark.parametrize(
    "rope_base,rope_scaling,layers",
    [(500000.0, "llama3", 3), (10000.0, None, 2)],
    ids=["llama3.1", "llama2"],
)
def test_logits_match_hugging_face_llama(rope_base, rope_scaling, layers):
    spec = tiny_llama_spec(rope_base, rope_scaling, layers)
    expected, got = logits_pair(spec)
    assert expected.abs().max() > 0.1  # a real signal, not near-zero logits
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= PARITY_MAX_ABS


def test_hugging_face_parity_detects_missing_rope_scaling():
    """The parity test is sharp enough: dropping the llama3 scaling breaks it."""
    spec = tiny_llama_spec(500000.0, "llama3", 3)
    expected, got = logits_pair(spec, ours_spec=replace(spec, rope_scaling=None))
    assert (got - expected).abs().max() > 100 * PARITY_MAX_ABS


def llama3_scaled_reference(base: float, dim: int) -> list[float]:
    """architectures.md, written out independently in float64."""
    factor, low, high, context = 8.0, 1.0, 4.0, 8192.0
    out = []
    for i in range(0, dim, 2):
        f = base ** (-i / dim)
        w = 2 * math.pi / f
        if w < context / high:
            out.append(f)
        elif w > context / low:
            out.append(f / factor)
        else:
            s = (context / w - low) / (high - low)
            out.append((1 - s) * f / factor + s * f)
    return out


@pytest.mark.parametrize("size", ["8b", "tiny"])
def test_llama3_rope_scaling_follows_formula(size):
    spec = get_model("pretrain_llama3.1", size)
    expected = torch.tensor(llama3_scaled_reference(spec.rope_base, spec.head_dim),
                            dtype=torch.float64)
    got = rope_frequencies(spec).double()
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0.0)
    # All three regimes (kept, slowed by 8, blended) occur, so each branch was checked.
    unscaled = torch.tensor(
        [spec.rope_base ** (-i / spec.head_dim) for i in range(0, spec.head_dim, 2)],
        dtype=torch.float64)
    ratio = got / unscaled
    assert (ratio - 1).abs().min() < 1e-6
    assert (ratio - 1 / 8).abs().min() < 1e-6
    assert ((ratio > 1 / 8 + 1e-3) & (ratio < 1 - 1e-3)).any()


def test_llama2_rope_is_unscaled():
    spec = get_model("pretrain_llama2", "70b")
    expected = torch.tensor([10000.0 ** (-i / 128) for i in range(0, 128, 2)])
    torch.testing.assert_close(rope_frequencies(spec), expected, rtol=1e-6, atol=0.0)


def test_logits_depend_only_on_relative_positions():
    """Explicit positions are honoured, and RoPE makes a constant shift irrelevant."""
    torch.manual_seed(0)
    model = Transformer(get_model("pretrain_llama3.1", "tiny")).eval()
    tokens = torch.randint(0, 512, (2, 32))
    with torch.no_grad():
        base = model(tokens)
        shifted = model(tokens, positions=torch.arange(32) + 1000)
        per_row = model(tokens, positions=torch.arange(32).expand(2, 32))
        scrambled = model(tokens, positions=torch.arange(32).flip(0))
    # fp32 angles at position ~1000 carry ~1e-4 rad of rounding.
    torch.testing.assert_close(shifted, base, atol=1e-4, rtol=1e-3)
    torch.testing.assert_close(per_row, base, atol=0.0, rtol=0.0)
    assert (scrambled - base).abs().max() > 1e-3


# ------------------------------------------------------------------ Nemotron-4


def test_layernorm1p_is_layer_norm_with_zero_centred_gain():
    torch.manual_seed(0)
    norm = LayerNorm1p(64, eps=1e-5)
    assert torch.equal(norm.weight, torch.zeros(64)) and torch.equal(norm.bias, torch.zeros(64))
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(3, 5, 64) * 4 + 2
    expected = F.layer_norm(x, (64,), eps=1e-5) * (1 + norm.weight) + norm.bias
    torch.testing.assert_close(norm(x), expected, atol=1e-6, rtol=1e-6)


def test_nemotron4_rotates_only_first_half_of_each_head():
    spec = get_model("pretrain_nemotron4", "tiny")
    assert rope_frequencies(spec).numel() == spec.head_dim // 4
    torch.manual_seed(0)
    model = Transformer(spec).eval()
    attention = model.layers["0"].attention
    seen = {}

    def capture(q, k, v):  # per-module replacement, as context parallelism does
        seen["q"], seen["k"] = q, k
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    attention.attend = capture
    tokens = torch.randint(0, spec.vocab_size, (2, 16))
    with torch.no_grad():
        x = model.layers["0"].attention_norm(model.tok_embeddings(tokens))
        model(tokens)
        q_plain = attention.wq(x).view(2, 16, -1, spec.head_dim).transpose(1, 2)
        k_plain = attention.wk(x).view(2, 16, -1, spec.head_dim).transpose(1, 2)
    half = spec.head_dim // 2
    for got, plain in ((seen["q"], q_plain), (seen["k"], k_plain)):
        assert got.shape == plain.shape
        torch.testing.assert_close(got[..., half:], plain[..., half:], atol=0.0, rtol=0.0)
        # Position 0 is the identity rotation; later positions move the first half.
        torch.testing.assert_close(got[:, :, 0], plain[:, :, 0], atol=1e-6, rtol=1e-6)
        assert (got[:, :, 1:, :half] - plain[:, :, 1:, :half]).abs().max() > 1e-2


def test_apply_rotary_rotates_pairs_of_halves():
    """Rotate-halves convention: dims (i, i + d/2) form a pair rotated by angle pos*f_i."""
    inv_freq = torch.tensor([1.0, 0.1])
    cos, sin = rope_cos_sin(inv_freq, torch.tensor([3]))
    x = torch.randn(1, 1, 1, 6)
    got = apply_rotary(x, cos, sin)
    for i, f in enumerate(inv_freq.tolist()):
        a, b = x[0, 0, 0, i].item(), x[0, 0, 0, i + 2].item()
        c, s = math.cos(3 * f), math.sin(3 * f)
        assert got[0, 0, 0, i].item() == pytest.approx(a * c - b * s, abs=1e-6)
        assert got[0, 0, 0, i + 2].item() == pytest.approx(b * c + a * s, abs=1e-6)
    assert torch.equal(got[..., 4:], x[..., 4:])


def test_nemotron4_mlp_is_squared_relu_without_gate():
    torch.manual_seed(0)
    mlp = Transformer(get_model("pretrain_nemotron4", "tiny")).layers["0"].mlp
    assert {name for name, _ in mlp.named_parameters()} == {"w1.weight", "w2.weight"}
    x = torch.randn(2, 8, 64)
    expected = (torch.clamp(x @ mlp.w1.weight.T, min=0) ** 2) @ mlp.w2.weight.T
    torch.testing.assert_close(mlp(x), expected, atol=1e-6, rtol=1e-5)


def test_tiny_nemotron4_trains_forward_backward():
    spec = get_model("pretrain_nemotron4", "tiny")
    torch.manual_seed(0)
    model = build_model(spec)
    tokens = torch.randint(0, spec.vocab_size, (2, 32))
    logits = model(tokens)
    assert logits.shape == (2, 32, spec.vocab_size)
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    assert abs(loss.item() - math.log(spec.vocab_size)) < 0.5  # near-uniform at init
    loss.backward()
    assert_every_parameter_trained(model)


# ------------------------------------------------------------- sizes and init


FAMILY_SIZES = [key for key, spec in MODELS.items() if spec.family in ("llama", "nemotron4")]


@pytest.mark.parametrize("workload,size", FAMILY_SIZES, ids=["/".join(k) for k in FAMILY_SIZES])
def test_meta_parameter_count_matches_catalog_formula(workload, size):
    spec = MODELS[(workload, size)]
    assert count_parameters_meta(spec) == parameter_count(spec)


def test_llama31_8b_has_8_03_billion_parameters():
    count = count_parameters_meta(get_model("pretrain_llama3.1", "8b"))
    assert abs(count - 8.03e9) < 0.005e9


def materialised(spec: ModelSpec, seed: int) -> Transformer:
    with torch.device("meta"):
        model = build_model(spec)
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    model.init_weights()
    return model


@pytest.mark.parametrize("workload", ["pretrain_llama3.1", "pretrain_nemotron4"])
def test_meta_build_then_init_is_finite_and_deterministic(workload):
    spec = get_model(workload, "tiny")
    a, b, c = materialised(spec, 1), materialised(spec, 1), materialised(spec, 2)
    for (name, pa), pb, pc in zip(a.state_dict().items(), b.state_dict().values(),
                                  c.state_dict().values()):
        assert torch.equal(pa, pb), name
        if name.endswith(("wq.weight", "w1.weight", "output.weight")):
            assert not torch.equal(pa, pc), name
    # The RoPE table is not in the state dict; it must have been recomputed.
    torch.testing.assert_close(a.rope_inv_freq, rope_frequencies(spec), atol=0.0, rtol=0.0)
    # Norms start as the identity; residual output projections scaled down with depth.
    identity = 1.0 if spec.norm == "rmsnorm" else 0.0
    assert torch.all(a.layers["0"].attention_norm.weight == identity)
    assert torch.all(a.norm.weight == identity)
    out_std = a.layers["0"].attention.wo.weight.std().item()
    assert out_std == pytest.approx(0.02 / math.sqrt(2 * spec.layers), rel=0.1)
    assert a.tok_embeddings.weight.std().item() == pytest.approx(0.02, rel=0.1)
    tokens = torch.randint(0, spec.vocab_size, (2, 16))
    with torch.no_grad():
        logits = a(tokens)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits, b(tokens).detach(), atol=0.0, rtol=0.0)


def test_pipeline_stages_compose_to_the_full_model():
    """Stages that drop embeddings/norm/head and some layers keep names and outputs."""
    torch.manual_seed(0)
    full = Transformer(get_model("pretrain_llama3.1", "tiny")).eval()
    first, last = copy.deepcopy(full), copy.deepcopy(full)
    for i in (2, 3):
        del first.layers[str(i)]
    for i in (0, 1):
        del last.layers[str(i)]
    first.norm = first.output = None
    last.tok_embeddings = None
    full_names = set(full.state_dict())
    assert set(first.state_dict()) | set(last.state_dict()) == full_names
    assert "layers.3.attention.wq.weight" in last.state_dict()
    tokens = torch.randint(0, 512, (2, 16))
    with torch.no_grad():
        hidden = first(tokens)
        assert hidden.shape == (2, 16, 64)
        torch.testing.assert_close(last(hidden), full(tokens), atol=0.0, rtol=0.0)


def test_build_model_rejects_unknown_family():
    spec = replace(get_model("pretrain_llama2", "tiny"), family="gpt")
    with pytest.raises(ValueError, match="unknown model family 'gpt'"):
        build_model(spec)
