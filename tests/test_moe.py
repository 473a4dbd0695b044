"""Mixture-of-experts models (engine/models/moe.py, qwen3_moe.py, deepseek_v3.py) against
hand computations, a naive per-token reference, the published parameter counts and a
hand count of their FLOPs.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from trainbench import flops as fl
from trainbench.catalog.models import (
    MODELS,
    active_parameter_count,
    get_model,
    parameter_count,
)
from trainbench.engine.models import build_model, count_parameters_meta
from trainbench.engine.models.deepseek_v3 import MLAttention
from trainbench.engine.models.moe import (
    MoE,
    moe_layers,
    sequence_balance_loss,
    sigmoid_topk,
    softmax_topk,
    switch_balance_loss,
    total_aux_loss,
    update_expert_biases,
)
from trainbench.engine.models.transformer import rope_cos_sin
from trainbench.plan import PlanError
from trainbench.planning import build_plan

QWEN_TINY = get_model("pretrain_qwen3", "tiny")
DSV3_TINY = get_model("pretrain_deepseek_v3", "tiny")


pytestmark = pytest.mark.usefixtures("one_thread")


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


# ------------------------------------------------------------------------ routers


def test_softmax_topk_by_hand():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 3.0, 0.5]])
    weights, ids, probs = softmax_topk(logits, 2, renormalize=False)
    z0 = math.exp(2) + math.exp(1) + math.exp(0) + math.exp(-1)
    assert ids[0].tolist() == [0, 1] and ids[1].tolist() == [2, 3]
    assert weights[0].tolist() == pytest.approx([math.exp(2) / z0, math.exp(1) / z0])
    assert probs[0].tolist() == pytest.approx([math.exp(v) / z0 for v in (2, 1, 0, -1)])
    renormed, ids2, _ = softmax_topk(logits, 2, renormalize=True)
    assert torch.equal(ids, ids2)
    e = math.exp(1)  # renormalised over the two chosen: e^2/(e^2+e), e/(e^2+e)
    assert renormed[0].tolist() == pytest.approx([e / (e + 1), 1 / (e + 1)])
    assert renormed[1].tolist() == pytest.approx(
        [math.exp(3) / (math.exp(3) + math.exp(0.5)), math.exp(0.5) / (math.exp(3) + math.exp(0.5))])


def test_sigmoid_bias_changes_the_choice_but_not_the_weights():
    logits = torch.tensor([[0.5, 0.4, 0.0, -1.0]])
    no_bias = torch.zeros(4)
    w, ids, _ = sigmoid_topk(logits, 2, no_bias, 1, 1, renormalize=True, scaling=2.5)
    assert sorted(ids[0].tolist()) == [0, 1]
    bias = torch.tensor([0.0, 0.0, 1.0, 0.0])  # lifts expert 2 above expert 1 for the choice
    w, ids, scores = sigmoid_topk(logits, 2, bias, 1, 1, renormalize=True, scaling=2.5)
    assert ids[0].tolist() == [2, 0]
    s0, s2 = sigmoid(0.5), sigmoid(0.0)  # the unbiased affinities weigh the outputs
    assert w[0].tolist() == pytest.approx([2.5 * s2 / (s0 + s2), 2.5 * s0 / (s0 + s2)])
    assert scores[0].tolist() == pytest.approx([sigmoid(v) for v in (0.5, 0.4, 0.0, -1.0)])


def test_group_limited_routing_skips_the_best_expert_of_a_weak_group():
    # 4 groups of 2; a group scores the sum of its two affinities. Group 0 holds the best
    # expert (logit 3) but a poor partner: s(3)+s(-5) = 0.96 < groups 1 (1.46), 2 (1.42).
    logits = torch.tensor([[3.0, -5.0, 1.0, 1.0, 0.9, 0.9, 0.0, 0.0]])
    bias = torch.zeros(8)
    _, ids, _ = sigmoid_topk(logits, 2, bias, n_group=4, topk_group=2, renormalize=True,
                             scaling=1.0)
    assert sorted(ids[0].tolist()) == [2, 3]
    _, ids, _ = sigmoid_topk(logits, 2, bias, n_group=1, topk_group=1, renormalize=True,
                             scaling=1.0)
    assert ids[0, 0].item() == 0  # without groups the best expert wins


# ----------------------------------------------------------- balance losses, bias


def test_switch_balance_loss_by_hand():
    probs = torch.tensor([[0.7, 0.3], [0.4, 0.6]])
    ids = torch.tensor([[0], [0]])  # both tokens to expert 0: f = (1, 0), P = (0.55, 0.45)
    assert switch_balance_loss(probs, ids, 2).item() == pytest.approx(2 * 0.55)
    ids = torch.tensor([[0], [1]])  # balanced: f = (0.5, 0.5) -> E * sum f P = 1
    assert switch_balance_loss(probs, ids, 2).item() == pytest.approx(1.0)


def test_sequence_balance_loss_by_hand():
    # One sequence of 2 tokens, E = 2, k = 1; affinities normalise to (0.8, 0.2), (0.5, 0.5).
    scores = torch.tensor([[0.4, 0.1], [0.3, 0.3]])
    ids = torch.tensor([[0], [0]])
    # f_0 = E/(k T) * 2 = 2, f_1 = 0; P_0 = (0.8 + 0.5)/2 = 0.65.
    assert sequence_balance_loss(scores, ids, 2, batch=1).item() == pytest.approx(1.3)
    # Two sequences of one token each are averaged: (2*0.8 + 2*0.5) / 2.
    assert sequence_balance_loss(scores, ids, 2, batch=2).item() == pytest.approx(1.3)
    ids = torch.tensor([[0], [1]])  # second sequence now picks expert 1: (1.6 + 1.0) / 2
    assert sequence_balance_loss(scores, ids, 2, batch=2).item() == pytest.approx(1.3)
    ids = torch.tensor([[1], [1]])  # (2*0.2 + 2*0.5) / 2
    assert sequence_balance_loss(scores, ids, 2, batch=2).item() == pytest.approx(0.7)


def test_aux_loss_reaches_the_router_gradient_as_if_added_to_the_loss():
    torch.manual_seed(0)
    spec = replace(QWEN_TINY, aux_loss_coef=0.5)  # large, so its gradient is visible
    moe = MoE(spec)
    moe.init_weights(0.02)
    x = torch.randn(2, 8, spec.hidden)
    moe(x).sum().backward()
    with_hook = moe.router.weight.grad.clone()
    moe.zero_grad()
    # Reference: the same layer without the hook, its balance loss added by hand.
    plain = MoE(replace(spec, aux_loss_coef=0.0))
    plain.load_state_dict(moe.state_dict())
    out = plain(x)
    _, ids, probs = plain.route(x.reshape(-1, spec.hidden))
    (out.sum() + 0.5 * switch_balance_loss(probs, ids, spec.n_routed_experts)).backward()
    torch.testing.assert_close(with_hook, plain.router.weight.grad)
    assert not torch.allclose(with_hook, torch.zeros_like(with_hook))
    assert moe.last_aux_loss is not None and plain.last_aux_loss is None
    # With the trainer's 1/GA loss scale (here 4 microbatches), as if aux / 4 were added.
    moe.zero_grad()
    plain.zero_grad()
    moe.aux_grad_scale = 0.25
    (moe(x).sum() / 4).backward()
    out = plain(x)
    _, ids, probs = plain.route(x.reshape(-1, spec.hidden))
    ((out.sum() + 0.5 * switch_balance_loss(probs, ids, spec.n_routed_experts)) / 4).backward()
    torch.testing.assert_close(moe.router.weight.grad, plain.router.weight.grad)


def test_loss_free_bias_moves_towards_balance():
    moe = MoE(DSV3_TINY)
    moe.init_weights(0.02)
    moe.expert_load.copy_(torch.tensor([5.0, 1, 1, 1, 0, 0, 0, 0]))  # mean 1
    moe.update_bias()
    g = DSV3_TINY.bias_update_speed
    assert moe.expert_bias.tolist() == pytest.approx([-g, 0, 0, 0, g, g, g, g])
    assert moe.expert_load.sum().item() == 0


# ------------------------------------------------------------------------ dropless


def naive_moe(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token: each chosen expert's SwiGLU times its gate, plus the shared expert."""
    tokens = x.reshape(-1, x.shape[-1])
    weights, ids, _ = moe.route(tokens)
    out = []
    for t in range(tokens.shape[0]):
        y = torch.zeros(tokens.shape[1])
        for w, e in zip(weights[t], ids[t]):
            xt = tokens[t]
            y = y + w * ((F.silu(xt @ moe.w1[e].T) * (xt @ moe.w3[e].T)) @ moe.w2[e].T)
        if moe.shared is not None:
            y = y + moe.shared(tokens[t])
        out.append(y)
    return torch.stack(out).view_as(x)


@pytest.mark.parametrize("spec", [QWEN_TINY, DSV3_TINY], ids=["qwen3", "deepseek_v3"])
def test_dropless_moe_equals_a_per_token_loop(spec):
    torch.manual_seed(1)
    moe = MoE(spec)
    moe.init_weights(0.02)
    # A skewed router: most tokens prefer the same experts, which a capacity would drop.
    moe.router.weight.data[0] += 0.5
    moe.eval()
    x = torch.randn(2, 16, spec.hidden)
    with torch.no_grad():
        out = moe(x)
        weights, ids, _ = moe.route(x.reshape(-1, spec.hidden))
        ref = naive_moe(moe, x)
    assert ids.shape == (32, spec.top_k)
    assert all(len(set(row)) == spec.top_k for row in ids.tolist())  # k distinct experts each
    counts = torch.bincount(ids.flatten(), minlength=spec.n_routed_experts)
    assert counts.max().item() > 32 * spec.top_k / spec.n_routed_experts  # really unbalanced
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_grouped_mm_path_equals_the_expert_loop():
    """The torch._grouped_mm call (the GPU path) against the loop, forward and gradients,
    with an expert that gets no token; torch's CPU _grouped_mm runs it on 16-byte aligned
    shapes, which is all this checks of the GPU kernel: the offsets and weight layouts."""
    from trainbench.engine.models.moe import grouped_swiglu
    torch.manual_seed(4)
    E, d, f = 4, 16, 32
    weights = [torch.randn(E, f, d) * 0.1, torch.randn(E, f, d) * 0.1, torch.randn(E, d, f) * 0.1]
    x = torch.randn(10, d)
    counts = torch.tensor([3, 0, 5, 2])
    results = []
    for grouped in (True, False):
        leaves = [w.clone().requires_grad_() for w in weights]
        xs = x.clone().requires_grad_()
        out = grouped_swiglu(xs, counts, *leaves, grouped_mm=grouped)
        out.square().sum().backward()
        results.append((out.detach(), xs.grad, *(w.grad for w in leaves)))
    for grouped, loop in zip(*results):
        torch.testing.assert_close(grouped, loop)
    assert results[0][3][1].abs().sum() == 0  # the empty expert gets no gradient


def test_mxfp8_experts_quantise_the_grouped_gemm():
    """With the MX training wrappers the engine puts on the experts (float8.mx_config:
    torchao's MXFP8 grouped GEMM, emulated on a CPU), grouped_swiglu takes
    torch._grouped_mm on a CPU too, with groups of any size (here 0, 5, 37 and 22 rows:
    grouped_swiglu pads them to multiples of 32 for the weight gradient, torchao's own
    padding off). The result is the fp32 expert loop's within
    MXFP8's rounding and far from bf16's: e4m3 keeps 3 mantissa bits (an element rounds
    by up to 6.25%), and the three chained GEMMs quantise the input, the weights and the
    SwiGLU product (measured 6.4% relative error; the same rows in bf16, 0.5%). The
    gradients have the weights' shapes."""
    pytest.importorskip("torchao.prototype.moe_training")
    from torchao.prototype.moe_training.tensor import MXFP8TrainingWeightWrapperTensor

    from trainbench.engine.models.moe import grouped_swiglu
    from trainbench.engine.parallel.float8 import mx_config
    torch.manual_seed(5)
    E, d, f = 4, 64, 32
    weights = [torch.randn(E, f, d) * 0.1, torch.randn(E, f, d) * 0.1, torch.randn(E, d, f) * 0.1]
    counts = torch.tensor([0, 5, 37, 22])
    x = torch.randn(int(counts.sum()), d)
    reference = grouped_swiglu(x, counts, *weights, grouped_mm=False)
    config = mx_config("gloo")
    wrapped = [torch.nn.Parameter(MXFP8TrainingWeightWrapperTensor(w.clone(), config))
               for w in weights]
    xs = x.to(torch.bfloat16).requires_grad_()
    out = grouped_swiglu(xs, counts, *wrapped)
    error = (out.float() - reference).norm() / reference.norm()
    in_bf16 = grouped_swiglu(x.to(torch.bfloat16), counts,
                             *(w.to(torch.bfloat16) for w in weights), grouped_mm=False)
    bf16_error = (in_bf16.float() - reference).norm() / reference.norm()
    assert 5 * bf16_error < error < 0.1, (error, bf16_error)
    out.float().square().sum().backward()
    for w, g in zip(weights, (p.grad for p in wrapped)):
        assert g.shape == w.shape and g.isfinite().all()
    assert xs.grad.isfinite().all() and xs.grad.abs().sum() > 0


# -------------------------------------------------------------------------- MLA


def test_mla_shapes_and_causality():
    torch.manual_seed(2)
    attn = MLAttention(DSV3_TINY)
    attn.init_weights(0.02)
    s = DSV3_TINY
    assert attn.wq_a.weight.shape == (s.q_lora_rank, s.hidden)
    assert attn.wkv_a.weight.shape == (s.kv_lora_rank + s.qk_rope_head_dim, s.hidden)
    assert attn.wkv_b.weight.shape == (s.heads * (s.qk_nope_head_dim + s.v_head_dim),
                                       s.kv_lora_rank)
    assert attn.wo.weight.shape == (s.hidden, s.heads * s.v_head_dim)
    inv_freq = 1.0 / (s.rope_base ** (torch.arange(0, s.qk_rope_head_dim, 2).float()
                                      / s.qk_rope_head_dim))
    rope = rope_cos_sin(inv_freq, torch.arange(12))
    x = torch.randn(1, 12, s.hidden)
    out = attn(x, rope)
    assert out.shape == x.shape
    changed = x.clone()
    changed[:, 8:] = torch.randn(1, 4, s.hidden)  # only the future of position 7 changes
    out2 = attn(changed, rope)
    torch.testing.assert_close(out[:, :8], out2[:, :8])
    assert not torch.allclose(out[:, 8:], out2[:, 8:])


def test_deepseek_v3_layout_dense_then_moe():
    model = build_model(DSV3_TINY)
    kinds = [type(layer.mlp).__name__ for layer in model.layers.values()]
    assert kinds == ["MLP"] + ["MoE"] * (DSV3_TINY.layers - 1)
    assert len(moe_layers(model)) == DSV3_TINY.layers - DSV3_TINY.first_dense_layers


# ----------------------------------------------------- Hugging Face parity (fp32)


def _experts_from_hf(sd: dict, prefix: str, ours: str, f: int) -> dict:
    """HF's fused experts (gate_up [E, 2f, d], down [E, d, f]) -> w1, w3 [E, f, d], w2 [E, d, f]."""
    gate_up = sd[prefix + "experts.gate_up_proj"]
    return {f"{ours}.w1": gate_up[:, :f], f"{ours}.w3": gate_up[:, f:],
            f"{ours}.w2": sd[prefix + "experts.down_proj"],
            f"{ours}.router.weight": sd[prefix + "gate.weight"]}


def _compare_logits(ours: torch.nn.Module, hf: torch.nn.Module, mapped: dict) -> torch.Tensor:
    ours.load_state_dict(mapped, strict=True)
    ours.eval()
    tokens = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits = ours(tokens)
        torch.testing.assert_close(logits, hf(tokens).logits, rtol=0, atol=1e-5)
    return logits


def test_qwen3_moe_logits_match_hugging_face():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(6)
    spec = replace(QWEN_TINY, layers=2)
    config = transformers.Qwen3MoeConfig(
        vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, moe_intermediate_size=32,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=False,
        rope_theta=spec.rope_base, rms_norm_eps=spec.norm_eps, initializer_range=0.2,
        attn_implementation="eager", max_position_embeddings=4096)
    hf = transformers.Qwen3MoeForCausalLM(config).float().eval()
    sd = hf.state_dict()
    mapped = {"tok_embeddings.weight": sd["model.embed_tokens.weight"],
              "norm.weight": sd["model.norm.weight"], "output.weight": sd["lm_head.weight"]}
    names = {"attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj",
             "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj",
             "attention.q_norm": "self_attn.q_norm", "attention.k_norm": "self_attn.k_norm",
             "attention_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
    for i in range(2):
        for ours, theirs in names.items():
            mapped[f"layers.{i}.{ours}.weight"] = sd[f"model.layers.{i}.{theirs}.weight"]
        mapped.update(_experts_from_hf(sd, f"model.layers.{i}.mlp.", f"layers.{i}.moe", 32))
        mapped[f"layers.{i}.moe.expert_bias"] = torch.zeros(8)
    _compare_logits(build_model(spec), hf, mapped)


def test_deepseek_v3_logits_match_hugging_face_with_a_selection_bias():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(7)
    spec = replace(DSV3_TINY, layers=2)
    config = transformers.DeepseekV3Config(
        vocab_size=512, hidden_size=64, intermediate_size=192, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
        n_routed_experts=8, routed_scaling_factor=2.5, kv_lora_rank=16, q_lora_rank=32,
        qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, n_group=4, topk_group=2,
        num_experts_per_tok=2, first_k_dense_replace=1, tie_word_embeddings=False,
        # Halves rotated, as trainbench does; the released weights pair interleaved dims.
        rope_interleave=False, rms_norm_eps=spec.norm_eps, initializer_range=0.2,
        attn_implementation="eager")
    hf = transformers.DeepseekV3ForCausalLM(config).float().eval()
    bias = torch.randn(8) * 0.3
    hf.model.layers[1].mlp.gate.e_score_correction_bias.copy_(bias)
    sd = hf.state_dict()
    mapped = {"tok_embeddings.weight": sd["model.embed_tokens.weight"],
              "norm.weight": sd["model.norm.weight"], "output.weight": sd["lm_head.weight"]}
    names = {"attention.wq_a": "self_attn.q_a_proj", "attention.q_norm": "self_attn.q_a_layernorm",
             "attention.wq_b": "self_attn.q_b_proj",
             "attention.wkv_a": "self_attn.kv_a_proj_with_mqa",
             "attention.kv_norm": "self_attn.kv_a_layernorm", "attention.wkv_b": "self_attn.kv_b_proj",
             "attention.wo": "self_attn.o_proj", "attention_norm": "input_layernorm",
             "mlp_norm": "post_attention_layernorm"}
    swiglu = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
    for i in range(2):
        for ours, theirs in names.items():
            mapped[f"layers.{i}.{ours}.weight"] = sd[f"model.layers.{i}.{theirs}.weight"]
    for ours, theirs in swiglu.items():  # layer 0: dense
        mapped[f"layers.0.mlp.{ours}.weight"] = sd[f"model.layers.0.mlp.{theirs}.weight"]
        mapped[f"layers.1.mlp.shared.{ours}.weight"] = sd[
            f"model.layers.1.mlp.shared_experts.{theirs}.weight"]
    mapped.update(_experts_from_hf(sd, "model.layers.1.mlp.", "layers.1.mlp", 32))
    mapped["layers.1.mlp.expert_bias"] = bias
    model = build_model(spec)
    logits = _compare_logits(model, hf, mapped)
    model.layers["1"].mlp.expert_bias.zero_()  # the bias really decides the routing
    with torch.no_grad():
        tokens = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(5))
        assert not torch.allclose(model(tokens), logits, atol=1e-4)


# ------------------------------------------------------------- parameter counts


MOE_SIZES = [key for key, spec in MODELS.items() if spec.is_moe]


@pytest.mark.parametrize("workload,size", MOE_SIZES, ids=["/".join(k) for k in MOE_SIZES])
def test_meta_parameter_count_matches_catalog_formula(workload, size):
    spec = MODELS[(workload, size)]
    assert count_parameters_meta(spec) == parameter_count(spec)


@pytest.mark.parametrize("size,total,active", [
    ("30b_a3b", 30.5, 3.3),  # Qwen3-30B-A3B model card: 30.5B total, 3.3B activated
    ("235b_a22b", 235, 22),  # Qwen3-235B-A22B: 235B total, 22B activated
])
def test_qwen3_counts_match_the_published_ones(size, total, active):
    spec = get_model("pretrain_qwen3", size)
    digits = 1 if total < 100 else 0
    assert round(parameter_count(spec) / 1e9, digits) == total
    # Qwen's activated figures are the leading digits, cut rather than rounded: the
    # 30B-A3B count is 3.353B (embedding row included) and is published as 3.3B.
    scale = 10 if active < 10 else 1
    assert math.floor(active_parameter_count(spec) / 1e9 * scale) / scale == active


def test_deepseek_v3_counts_match_the_published_ones():
    spec = get_model("pretrain_deepseek_v3", "671b")
    assert round(parameter_count(spec) / 1e9) == 671  # main model, no MTP module
    # README_WEIGHTS.md: 36.6B activated "including 0.9B for the output Head", i.e.
    # without the input embedding (the report's abstract rounds it to 37B).
    without_embedding = active_parameter_count(spec) - spec.vocab_size * spec.hidden
    assert round(without_embedding / 1e9, 1) == 36.6
    assert round(spec.vocab_size * spec.hidden / 1e9, 1) == 0.9


def test_active_count_is_the_total_for_a_dense_model():
    spec = get_model("pretrain_llama3.1", "8b")
    assert active_parameter_count(spec) == parameter_count(spec)


# -------------------------------------------------------------------- FLOPs


def test_tiny_flops_against_a_hand_count():
    # Multiply-adds per token, counted by hand from the tiny specs; FLOPs = 6 x MACs x 128.
    # Qwen3 tiny: q 64*64, k and v 64*32, o 64*64 = 12288; causal scores 128*4*16 = 8192
    # (two matmuls, half the positions); router 64*8 = 512; 2 experts x 3*64*32 = 12288.
    qwen_layer = 12288 + 8192 + 512 + 12288
    head = 64 * 512
    assert fl.flops_per_sequence(QWEN_TINY, convention="causal") == 6 * 128 * (
        4 * qwen_layer + head)
    assert fl.flops_per_sequence(QWEN_TINY, convention="published") == 6 * 128 * (
        4 * (qwen_layer + 8192) + head)  # non-causal scores: counted in full
    # DeepSeek-V3 tiny MLA: q 64*32 + 32*4*24, kv_a 64*24, kv_b 16*4*32, o 4*16*64 = 12800;
    # causal scores 128*4*(24+16)/2 = 10240. Layer 0 dense 3*64*192; layers 1-3 router
    # 64*8 and (2 routed + 1 shared) x 3*64*32.
    mla = 2048 + 3072 + 1536 + 2048 + 4096
    dense, moe = 3 * 64 * 192, 512 + 3 * 3 * 64 * 32
    assert fl.flops_per_sequence(DSV3_TINY, convention="causal") == 6 * 128 * (
        4 * (mla + 10240) + dense + 3 * moe + head)
    assert fl.flops_per_sequence(DSV3_TINY, convention="published") == 6 * 128 * (
        4 * (mla + 20480) + dense + 3 * moe + head)


# ------------------------------------------------------------------- training


@pytest.mark.parametrize("spec", [QWEN_TINY, DSV3_TINY], ids=["qwen3", "deepseek_v3"])
def test_tiny_model_trains_to_a_falling_loss(spec):
    torch.manual_seed(3)
    model = build_model(spec)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, spec.vocab_size, (4, 33))
    losses = []
    for _ in range(10):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        update_expert_biases(moe_layers(model))
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5
    assert total_aux_loss(model) is not None
    if spec.bias_update_speed:  # the loss-free bias has moved away from zero
        assert any(m.expert_bias.abs().sum() > 0 for m in moe_layers(model))


# ------------------------------------------------------------------------ plans


def test_expert_parallel_and_unsupported_layouts_are_refused():
    with pytest.raises(PlanError, match="ep=2 does not divide tp x cp x dp = 1 x 1 x 1 = 1"):
        build_plan("pretrain_qwen3", "tiny", "fp32", 2, "cpu", overrides={"ep": 2, "dp": 1,
                                                                          "pp": 2})
    with pytest.raises(PlanError, match="FP8 for MoE needs torchao's float8 grouped GEMM"):
        build_plan("pretrain_deepseek_v3", "tiny", "fp8", 1, "cpu")
    assert build_plan("pretrain_deepseek_v3", "tiny", "fp32", 2, "cpu",
                      overrides={"tp": 2}).layout.tp == 2
    # BF16 layouts of the real sizes were published for GB200/GB300 only (catalog.recipes).
    with pytest.raises(PlanError, match="671b has no bf16 recipe for h100 .published: gb200 "
                                        "x256, gb300 x256"):
        build_plan("pretrain_deepseek_v3", "671b", "bf16", 64, "h100")
    plan = build_plan("pretrain_deepseek_v3", "671b", "bf16", 64, "h100",
                      overrides={"tp": 1, "pp": 1, "cp": 1, "ep": 1, "vp": 1, "dp": 64,
                                 "mbs": 1, "gbs": 128}, steps=3)
    assert (plan.layout.dp, plan.mbs, plan.gbs, plan.seq_len) == (64, 1, 128, 4096)
