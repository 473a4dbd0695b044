"""FP8 linears that keep their input's FP8 cast for the backward (engine/parallel/
float8_input.py), against torchao's stock Float8Linear, which keeps the bf16 input.

Tensorwise scaling casts the input for the weight gradient exactly as the forward did, so
the outputs and gradients must be the same bits; what is kept must be 1 byte an element
of each input, once per input however many linears read it. Shapes stay tiny: on a CPU
torch._scaled_mm is a software loop.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from helpers import FP8_SEQ, losses, read_metrics, train

torch = pytest.importorskip("torch")
pytest.importorskip("torchao.float8")

from torch.autograd.graph import saved_tensors_hooks  # noqa: E402

from trainbench.planning import build_plan  # noqa: E402

TOKENS = 2 * 16  # two sequences of 16 tokens


def _plan(*overrides: str, gpus: int = 1, recipe: str = "tensorwise"):
    from trainbench.overrides import parse_overrides
    return build_plan("pretrain_llama3.1", "tiny", "fp8", gpus, "cpu",
                      overrides=parse_overrides([f"fp8_recipe={recipe}", *overrides]))


def _blocks(plan):
    """One tiny Llama block converted by torchao alone, and the same block as the engine
    converts it (convert: torchao, then float8_input where it applies)."""
    from torchao.float8 import convert_to_float8_training

    from trainbench.engine.models.transformer import TransformerBlock
    from trainbench.engine.parallel import float8
    torch.manual_seed(0)
    block = TransformerBlock(plan.model)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.1)
    block = block.to(torch.bfloat16)
    stock = copy.deepcopy(block)
    convert_to_float8_training(stock, config=float8.float8_config(plan, "gloo"),
                               module_filter_fn=lambda m, fqn: float8.eligible(m, fqn))
    float8.convert(block, plan, "gloo")
    return stock, block


def _run(block, x):
    """Forward and backward of `block` on a copy of `x`; the output, the input's gradient
    and every parameter's gradient."""
    x = x.detach().clone().requires_grad_()
    out = block(x, None)
    out.float().square().sum().backward()
    return out, x.grad, {n: p.grad for n, p in block.named_parameters()}


def _saved(block, x):
    """Everything autograd keeps for the backward of one forward of `block`: bytes of the
    distinct storages (an FP8 tensor: its 1-byte data and its fp32 scale), and the FP8
    inputs kept, as {storage: (elements, times saved)}."""
    from torchao.float8.float8_training_tensor import Float8TrainingTensor
    storages: dict[int, int] = {}
    fp8: dict[int, list[int]] = {}

    def pack(t):
        parts = (t._data, t._scale) if isinstance(t, Float8TrainingTensor) else (t,)
        for part in parts:
            storage = part.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        if isinstance(t, Float8TrainingTensor):
            assert t._data.element_size() == 1
            key = t._data.untyped_storage().data_ptr()
            fp8.setdefault(key, [t._data.numel(), 0])[1] += 1
        return t

    x = x.detach().clone().requires_grad_()
    with saved_tensors_hooks(pack, lambda t: t):
        out = block(x, None)
    return out, sum(storages.values()), {k: tuple(v) for k, v in fp8.items()}


def _input(plan):
    torch.manual_seed(1)
    return torch.randn(2, TOKENS // 2, plan.model.hidden, dtype=torch.bfloat16)


def test_same_outputs_and_gradients_as_torchaos_float8_linear():
    """Bit for bit: the saved FP8 input is the tensor torchao's backward would cast again,
    and the shared cast's gradient (one sum over q, k and v) is the same sum."""
    from trainbench.engine.parallel.float8_input import Float8LinearKeepingFP8Input
    plan = _plan()
    stock, block = _blocks(plan)
    kept = {n for n, m in block.named_modules() if isinstance(m, Float8LinearKeepingFP8Input)}
    assert kept == {"attention.wq", "attention.wk", "attention.wv", "mlp.w1", "mlp.w3",
                    "mlp.w2"}
    x = _input(plan)
    out_s, gx_s, grads_s = _run(stock, x)
    out_b, gx_b, grads_b = _run(block, x)
    assert torch.equal(out_s, out_b)
    assert torch.equal(gx_s, gx_b)
    assert grads_s.keys() == grads_b.keys()
    for name in grads_s:
        assert torch.equal(grads_s[name], grads_b[name]), name


def test_inputs_kept_in_fp8_once_per_input_and_the_block_keeps_less():
    """The block keeps each FP8 linear's input as one FP8 tensor of 1 B an element, one
    per distinct input (q, k, v share the attention norm's output; gate and up the MLP
    norm's), and the bf16 tensors they replace are no longer kept: the attention norm's
    output and the MLP norm's ([tokens, hidden] each) and the SwiGLU product
    ([tokens, ffn]) drop from 2 B to 1 B an element, plus one fp32 scale each. The
    out-projection keeps bf16: its input is a view of the attention core's output, which
    the core keeps anyway."""
    plan = _plan()
    m = plan.model
    stock, block = _blocks(plan)
    x = _input(plan)
    _, stock_bytes, stock_fp8 = _saved(stock, x)
    _, kept_bytes, kept_fp8 = _saved(block, x)
    assert stock_fp8 == {}
    assert sorted(kept_fp8.values()) == sorted(
        [(TOKENS * m.hidden, 3), (TOKENS * m.hidden, 2), (TOKENS * m.ffn, 1)])
    freed = (2 - 1) * TOKENS * (m.hidden + m.hidden + m.ffn) - 3 * 4
    assert stock_bytes - kept_bytes == freed


def test_an_activation_checkpoint_recasts_and_keeps_nothing():
    """Inside a non-reentrant checkpoint the linears' saved FP8 casts are dropped with the
    rest (the cache holds them weakly), and the recomputation gives the same gradients."""
    from torch.utils.checkpoint import checkpoint
    plan = _plan()
    stock, block = _blocks(plan)
    x = _input(plan)
    grads = []
    for model in (stock, block):
        xx = x.detach().clone().requires_grad_()
        _, kept, fp8 = _saved(lambda y, r: checkpoint(model, y, r, use_reentrant=False), xx)
        assert fp8 == {}
        out = checkpoint(model, xx, None, use_reentrant=False)
        out.float().square().sum().backward()
        grads.append([xx.grad] + [p.grad for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


@pytest.mark.parametrize("overrides, fp8_wo, fp8_norm_inputs", [
    ((), False, True),
    (("recompute=selective",), True, True),
])
def test_which_linears_keep_fp8(overrides, fp8_wo, fp8_norm_inputs):
    """The out-projection keeps FP8 only where the attention core does not keep its output
    (selective recompute reruns it); the norm's readers keep FP8 at TP1."""
    from trainbench.engine.parallel.float8_input import keeps_fp8_input
    plan = _plan(*overrides)
    assert keeps_fp8_input("layers.0.attention.wo", plan, frozenset()) is fp8_wo
    assert keeps_fp8_input("layers.0.attention.wq", plan, frozenset()) is fp8_norm_inputs
    assert keeps_fp8_input("layers.0.mlp.w2", plan, frozenset()) is True
    cp = dataclasses.replace(plan, layout=dataclasses.replace(plan.layout, cp=2))
    assert keeps_fp8_input("layers.0.attention.wo", cp, frozenset()) is True


def test_sequence_parallel_gathered_inputs_and_moe_inputs_keep_bf16():
    """Under TP with sequence parallelism, q/k/v and gate/up read the all-gathered sequence,
    which GatherSequence gathers again in the backward rather than keep: an FP8 copy
    would add memory. An MoE's shared expert reads the input its bf16 router keeps."""
    from trainbench.engine.parallel.float8_input import keeps_fp8_input
    plan = _plan()
    tp2 = dataclasses.replace(plan, layout=dataclasses.replace(plan.layout, tp=2))
    for name in ("attention.wq", "attention.wk", "attention.wv", "mlp.w1", "mlp.w3"):
        assert not keeps_fp8_input(f"layers.0.{name}", tp2, frozenset())
    assert keeps_fp8_input("layers.0.mlp.w2", tp2, frozenset())
    full = dataclasses.replace(tp2, recompute="full")
    assert keeps_fp8_input("layers.0.attention.wq", full, frozenset())
    shared = frozenset({"layers.1.moe.shared.w1"})
    assert not keeps_fp8_input("layers.1.moe.shared.w1", plan, shared)


def test_rowwise_keeps_torchaos_linear():
    """Rowwise scales the weight gradient's input along the other axis: no FP8 copy of
    the forward's to reuse, the stock layer stays."""
    from torchao.float8.float8_linear import Float8Linear
    plan = _plan(recipe="rowwise")
    _, block = _blocks(plan)
    linears = [m for m in block.modules() if isinstance(m, Float8Linear)]
    assert linears and all(type(m) is Float8Linear for m in linears)


@pytest.mark.slow
@pytest.mark.dist
def test_tp2_run_matches_one_process_and_says_what_it_keeps(tmp_path, one_fp8_run):
    """Three tiny FP8 steps at TP2 (real gloo ranks: row-parallel layers keep FP8 DTensor
    shards, the gathered inputs keep bf16) against one process, at tests/test_fp8.py's
    tolerances; run.json says what was kept."""
    from test_fp8 import FP8_PARITY_GRAD_NORM_RTOL, FP8_PARITY_LOSS_RTOL, RUN_TIMEOUT
    one = one_fp8_run("pretrain_llama3.1")
    tp2 = train(tmp_path / "tp2", "pretrain_llama3.1", 2, "--set", f"tp=2 {FP8_SEQ}", dtype="fp8",
                timeout=RUN_TIMEOUT)
    assert losses(one) == pytest.approx(losses(tp2), rel=FP8_PARITY_LOSS_RTOL)
    norms = [[r["grad_norm"] for r in read_metrics(d)] for d in (one, tp2)]
    assert norms[0] == pytest.approx(norms[1], rel=FP8_PARITY_GRAD_NORM_RTOL)
    # Per layer: q, k, v, gate, up and down at TP1 (the out-projection's input is the
    # attention core's output, kept anyway); the down projection alone at TP2.
    layers = _plan().model.layers
    for run, per_layer in ((one, 6), (tp2, 1)):
        fp8 = json.loads((run / "run.json").read_text())["fp8"]
        assert fp8["saved_input"] == "fp8 where that frees the bf16 input, bf16 elsewhere"
        assert fp8["saved_input_fp8_linears"] == per_layer * layers


def test_real_width_llama_layer_keeps_its_fp8_inputs_as_predict_says(monkeypatch):
    """One Llama 3.1 8B layer of the FP8 seed row (CP2 x DP4, MBS 1, 8192 tokens: 4096 a
    rank), traced as `check` traces it: keeping the FP8 inputs frees, per token, the two
    norm outputs (hidden each), the SwiGLU product (ffn) and the CP concatenation of the
    attention's output (q = hidden), 1 B an element each, less their four fp32 scales;
    predict's engine model moves by the same bytes."""
    from test_activation_memory import _layer_activations, _predicted

    from trainbench.engine.parallel import float8_input
    kept, plan = _layer_activations("pretrain_llama3.1", "8b", "fp8", 8, 1)
    monkeypatch.setattr(float8_input, "enable", lambda model, plan: 0)
    stock, _ = _layer_activations("pretrain_llama3.1", "8b", "fp8", 8, 1)
    m = plan.model
    assert (plan.layout.cp, plan.layout.tp, plan.recompute) == (2, 1, "none")
    tokens = plan.mbs * plan.seq_len // plan.layout.cp
    freed = tokens * (2 * m.hidden + m.ffn + m.heads * m.head_dim) - 4 * 4
    assert stock - kept == freed
    bf16_input = dataclasses.replace(plan, fp8_recipe="rowwise")
    assert (_predicted(bf16_input, "attention", "mlp") - _predicted(plan, "attention", "mlp")
            == freed + 4 * 4)
