"""FP8 and MXFP8 mixtures of experts (issue 35, item 3): torchao's low-precision grouped
GEMMs with the token groups padded by the engine, and torchao's own padding off.

torchao 0.18's FP8 rowwise grouped GEMM (`_Float8GroupedMM`) asserts
`pad_token_groups_for_grouped_mm=True is not yet supported`, and its GPU kernels (Triton
quantisation, torch._scaled_grouped_mm) have no CPU form. So the FP8 tests here run
torchao's real autograd function (its asserts, layouts, padding-free offsets, the three
GEMMs of forward and backward) with those five kernels replaced by PyTorch emulations
written from their documented contracts: the same e4m3 casts and power-of-two rowwise
scales, dequantised and multiplied in fp32. The emulated torch._scaled_grouped_mm
checks what the CUDA kernel needs: every token group a multiple of 16 rows, the left
operand row-major and the right one column-major. They check the engine's side of the
contract and the numerics of FP8 rowwise; an FP8 GPU's speed they cannot. MXFP8 has a
CPU emulation in torchao itself (KernelPreference.EMULATED) and runs as is: a tiny MoE
step in MXFP8 trains in tests/test_fp8.py and reads nothing on the host in
tests/test_host_sync.py, its groups padded to 32 here in tests/test_moe.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainbench.engine.models import build_model
from trainbench.engine.models.moe import grouped_swiglu, moe_layers
from trainbench.planning import build_plan

pytest.importorskip("torchao.prototype.moe_training")

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max


pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------- the engine's configs


def test_the_expert_configs_leave_torchaos_padding_off():
    """FP8: rowwise e4m3 with bf16 outputs and torchao's padding off (its FP8 grouped
    GEMM asserts that); MXFP8: the real kernels on NCCL (Blackwell), the emulation on
    gloo, its padding off too (off Blackwell torchao's padding reads the group sizes on
    the host). The engine pads instead: moe.GROUP_ALIGNMENT."""
    from torchao.prototype.moe_training.config import (Float8TrainingOpConfig,
                                                       MXFP8TrainingOpConfig)
    from torchao.quantization.quantize_.common import KernelPreference

    from trainbench.engine.models.moe import GROUP_ALIGNMENT
    from trainbench.engine.parallel.float8 import fp8_expert_config, mx_config
    fp8 = fp8_expert_config()
    assert isinstance(fp8, Float8TrainingOpConfig)
    assert fp8.pad_token_groups_for_grouped_mm is False
    assert (fp8.float8_dtype, fp8.out_dtype) == (E4M3, torch.bfloat16)
    for backend, kernels in (("nccl", KernelPreference.AUTO),
                             ("gloo", KernelPreference.EMULATED)):
        mx = mx_config(backend)
        assert isinstance(mx, MXFP8TrainingOpConfig)
        assert mx.pad_token_groups_for_grouped_mm is False
        assert mx.kernel_preference == kernels
    assert GROUP_ALIGNMENT == {"Float8TrainingWeightWrapperTensor": 16,
                               "MXFP8TrainingWeightWrapperTensor": 32}


@pytest.mark.parametrize("workload", ["pretrain_qwen3", "pretrain_deepseek_v3"])
def test_fp8_conversion_wraps_the_experts_and_converts_the_dense_linears(workload):
    """The FP8 plan of an H100 converts the tiny model as the engine does: every MoE
    layer's w1, w3, w2 become torchao's FP8 training wrappers with the engine's config,
    the eligible linears Float8Linear, the router and output head stay high precision."""
    from torchao.float8.float8_linear import Float8Linear
    from torchao.prototype.moe_training.tensor import Float8TrainingWeightWrapperTensor

    from trainbench.engine.parallel import float8
    plan = build_plan(workload, "tiny", "fp8", 1, "h100")
    model = build_model(plan.model)
    float8.convert(model, plan, "gloo")
    layers = moe_layers(model)
    assert layers
    for moe in layers:
        for name in ("w1", "w3", "w2"):
            weight = getattr(moe, name)
            assert type(weight.data) is Float8TrainingWeightWrapperTensor
            assert weight.data.config == float8.fp8_expert_config()
        assert moe.lowp_experts == "fp8 rowwise (torchao grouped GEMM)"
        assert not isinstance(moe.router, Float8Linear)
    assert not isinstance(model.output, Float8Linear)
    assert any(isinstance(m, Float8Linear) for m in model.modules())


# ------------------------------------------- torchao's FP8 grouped GEMM, emulated


def _power_of_two_scale(amax: torch.Tensor, round_down: bool) -> torch.Tensor:
    """FP8_MAX / amax, rounded down to a power of two (torchao's rowwise recipe)."""
    scale = E4M3_MAX / amax.float().clamp(min=1e-12)
    return torch.exp2(torch.floor(torch.log2(scale))) if round_down else scale


def _cast(hp: torch.Tensor, scale: torch.Tensor, dtype) -> torch.Tensor:
    return (hp.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(dtype)


def _column_major(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(-2, -1).contiguous().transpose(-2, -1)


def rowwise_2d_scale_and_cast(hp, output_dtype=E4M3, round_scales_to_power_of_2=False):
    """A [M, K] row-major -> (e4m3 [M, K], scales [M, 1]), one scale per row."""
    scale = _power_of_two_scale(hp.abs().amax(dim=1, keepdim=True), round_scales_to_power_of_2)
    return _cast(hp, scale, output_dtype), scale


def colwise_3d_scale_and_cast(hp, output_dtype=E4M3, round_scales_to_power_of_2=False):
    """B_t [E, K, N] column-major -> (e4m3 [E, K, N] column-major, scales [E, 1, N])."""
    scale = _power_of_two_scale(hp.abs().amax(dim=1, keepdim=True), round_scales_to_power_of_2)
    return _column_major(_cast(hp, scale, output_dtype)), scale


def rowwise_3d_transpose_rhs(hp, output_dtype=E4M3, round_scales_to_power_of_2=False):
    """B_t [E, K, N] -> (B [E, N, K] e4m3 column-major, scales [E, K]): B for the input
    gradient grad_out [M, N] @ B_e, one scale per output column k."""
    scale = _power_of_two_scale(hp.abs().amax(dim=2), round_scales_to_power_of_2)  # [E, K]
    data = _cast(hp, scale.unsqueeze(-1), output_dtype).transpose(-2, -1)  # [E, N, K]
    return _column_major(data), scale


def _group_of_row(offsets: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.searchsorted(offsets.long(), torch.arange(rows), right=True)


def per_group_colwise_scales_dual(t1, t2, offsets, output_dtype=E4M3,
                                  round_scales_to_power_of_2=False):
    """Two [M, N_i] tensors sharing token groups along M -> for each, (e4m3 data
    column-major, scales [G * N_i]): one scale per (group, column), the amax over the
    group's rows (rows past the last group are scaled by 1; no GEMM reads them)."""
    G = offsets.numel()
    group = _group_of_row(offsets, t1.shape[0])
    out = []
    for t in (t1, t2):
        amax = torch.zeros(G + 1, t.shape[1]).scatter_reduce_(
            0, group.unsqueeze(1).expand(t.shape), t.abs().float(), "amax")[:G]
        scale = _power_of_two_scale(amax, round_scales_to_power_of_2)
        row_scale = torch.cat([scale, torch.ones(1, t.shape[1])])[group]
        out += [_column_major(_cast(t, row_scale, output_dtype)), scale.flatten()]
    return tuple(out)


def scaled_grouped_mm(mat_a, mat_b, scale_a, scale_b, offs=None, bias=None, scale_result=None,
                      out_dtype=None, use_fast_accum=False):
    """torch._scaled_grouped_mm on a CPU: dequantise, then torch._grouped_mm in fp32.
    Checks the CUDA kernel's contract: e4m3 operands, the left row-major and the right
    column-major, int32 offsets, every group a multiple of 16 rows."""
    assert mat_a.dtype == mat_b.dtype == E4M3 and offs.dtype == torch.int32
    assert mat_a.stride(-1) == 1, "the left operand must be row-major"
    assert mat_b.stride(-2) == 1, "the right operand must be column-major"
    sizes = torch.diff(offs.long(), prepend=offs.new_zeros(1).long())
    assert (sizes % 16 == 0).all(), f"token groups not multiples of 16: {sizes.tolist()}"
    if mat_b.ndim == 3:  # [M, K] x [E, K, N], groups along M: rowwise scales
        a = mat_a.float() * scale_a.unsqueeze(-1)
        b = mat_b.float() * scale_b.unsqueeze(1)
    else:  # [N, M] x [M, K], groups along M (the weight gradient): per-group scales
        G = offs.numel()
        group = _group_of_row(offs, mat_a.shape[1]).clamp(max=G - 1)
        a = mat_a.float() * scale_a.view(G, -1)[group].T
        b = mat_b.float() * scale_b.view(G, -1)[group]
    return torch._grouped_mm(a, b, offs=offs).to(out_dtype)


@pytest.fixture
def emulated_fp8_kernels(monkeypatch):
    """torchao's FP8 grouped GEMM with its GPU kernels emulated (module docstring)."""
    from torchao.prototype.moe_training import fp8_grouped_mm
    for name, fn in (("triton_fp8_rowwise_2d_scale_and_cast", rowwise_2d_scale_and_cast),
                     ("triton_fp8_colwise_3d_scale_and_cast", colwise_3d_scale_and_cast),
                     ("triton_fp8_rowwise_3d_transpose_rhs", rowwise_3d_transpose_rhs),
                     ("triton_fp8_per_group_colwise_scales_dual",
                      per_group_colwise_scales_dual)):
        monkeypatch.setattr(fp8_grouped_mm, name, fn)
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[4])
        return scaled_grouped_mm(*args, **kwargs)
    monkeypatch.setattr(torch, "_scaled_grouped_mm", counted, raising=False)
    return calls


def _swiglu_weights(E: int, d: int, f: int, seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return [torch.randn(E, f, d) * 0.1, torch.randn(E, f, d) * 0.1, torch.randn(E, d, f) * 0.1]


def test_fp8_experts_run_torchaos_grouped_gemm_on_groups_padded_by_the_engine(
        emulated_fp8_kernels):
    """Groups of 0, 5, 37 and 22 rows, unaligned as dropless routing gives them: with the
    FP8 wrappers grouped_swiglu pads them to 0, 16, 48 and 32 rows, torchao's FP8
    grouped GEMM runs with its padding off (it asserts otherwise) on those offsets, and
    the result is the fp32 loop's within FP8's rounding (e4m3 rounds an element by up
    to 6.25%; three chained GEMMs quantise input, weights and the SwiGLU product), far
    from bf16's. Forward and backward ran 3 + 6 scaled grouped GEMMs, each on the
    padded offsets; the gradients have the weights' shapes and point the fp32
    gradients' way."""
    from torchao.prototype.moe_training.tensor import Float8TrainingWeightWrapperTensor

    from trainbench.engine.parallel.float8 import fp8_expert_config
    E, d, f = 4, 64, 32
    weights = _swiglu_weights(E, d, f, seed=5)
    counts = torch.tensor([0, 5, 37, 22])
    x = torch.randn(int(counts.sum()), d)
    leaves = [w.clone().requires_grad_() for w in weights]
    xr = x.clone().requires_grad_()
    reference = grouped_swiglu(xr, counts, *leaves, grouped_mm=False)
    reference.square().sum().backward()
    wrapped = [torch.nn.Parameter(Float8TrainingWeightWrapperTensor(w.clone(),
                                                                    fp8_expert_config()))
               for w in weights]
    xs = x.to(torch.bfloat16).requires_grad_()
    out = grouped_swiglu(xs, counts, *wrapped)
    assert out.shape == reference.shape and out.dtype == torch.bfloat16
    error = (out.float() - reference.detach()).norm() / reference.norm()
    in_bf16 = grouped_swiglu(x.to(torch.bfloat16), counts,
                             *(w.to(torch.bfloat16) for w in weights), grouped_mm=False)
    bf16_error = (in_bf16.float() - reference.detach()).norm() / reference.norm()
    assert 3 * bf16_error < error < 0.1, (error, bf16_error)
    out.float().square().sum().backward()
    assert len(emulated_fp8_kernels) == 9
    assert all(offs.tolist() == [0, 16, 64, 96] for offs in emulated_fp8_kernels)
    for exact, p in zip(leaves, wrapped):
        g = p.grad
        assert g.shape == exact.shape and g.isfinite().all()
        cosine = F.cosine_similarity(g.flatten().float(), exact.grad.flatten(), dim=0)
        assert cosine > 0.95, cosine
    cosine = F.cosine_similarity(xs.grad.flatten().float(), xr.grad.flatten(), dim=0)
    assert cosine > 0.95, cosine


def test_without_the_engines_padding_torchao_refuses_the_groups(emulated_fp8_kernels):
    """The control: the same unaligned groups handed to torchao's FP8 grouped GEMM with
    its own padding on fail its assert (issue 35's first-step failure), and with it off
    but unpadded they fail the kernel's multiple-of-16 contract."""
    from torchao.prototype.moe_training.fp8_grouped_mm import (
        _to_fp8_rowwise_then_scaled_grouped_mm,
    )
    w = _swiglu_weights(4, 64, 32, seed=1)[0]
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    offs = torch.cumsum(torch.tensor([0, 5, 37, 22]), 0).to(torch.int32)
    with pytest.raises(AssertionError, match="pad_token_groups_for_grouped_mm=True is not yet"):
        _to_fp8_rowwise_then_scaled_grouped_mm(x, w.transpose(-2, -1), offs)
    with pytest.raises(AssertionError, match="not multiples of 16"):
        _to_fp8_rowwise_then_scaled_grouped_mm(x, w.transpose(-2, -1), offs,
                                               pad_token_groups_for_grouped_mm=False)


@pytest.mark.parametrize("workload", ["pretrain_qwen3", "pretrain_deepseek_v3"])
def test_an_fp8_moe_model_trains_with_torchaos_grouped_gemm(emulated_fp8_kernels, workload):
    """Qwen3 and DeepSeek-V3 tiny, converted as an H100 FP8 plan converts them (FP8
    experts through torchao's grouped GEMM, Float8Linear dense layers), in bf16 as
    FSDP's mixed precision feeds them: three AdamW steps on one batch lower the loss,
    which starts where the bf16 model's does."""
    from trainbench.engine.parallel import float8
    plan = build_plan(workload, "tiny", "fp8", 1, "h100")
    torch.manual_seed(0)
    reference = build_model(plan.model)
    model = build_model(plan.model)
    model.load_state_dict(reference.state_dict())
    float8.convert(model, plan, "gloo")
    tokens = torch.randint(0, plan.model.vocab_size, (2, 65))

    def loss_of(m):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = m(tokens[:, :-1])
        return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
    with torch.no_grad():
        bf16_loss = loss_of(reference)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(3):
        loss = loss_of(model)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(bf16_loss.item(), rel=0.02)
    assert losses[-1] < losses[0]
    assert emulated_fp8_kernels and all(
        (torch.diff(o.long(), prepend=o.new_zeros(1).long()) % 16 == 0).all()
        for o in emulated_fp8_kernels)
