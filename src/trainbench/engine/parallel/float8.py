"""FP8 training through torchao, the same code on a GPU and on a CPU.

`convert` swaps the eligible nn.Linear layers for torchao's Float8Linear (the recipe
picks the scaling: `tensorwise`, one dynamic scale per tensor, NeMo's "current scaling";
`rowwise`, one per row, scales rounded to powers of two). Layers kept in bf16, on every
device alike: the output head (its logits feed the loss directly; torchtitan and NeMo keep
it in high precision) and any layer whose GEMM dimensions, as each TP rank holds them,
are not multiples of 16 (FP8 GEMMs need that; e.g. the tiny Nemotron-H's Mamba in_proj,
328 wide).

`mxfp8` (Blackwell) goes through torchao's MX training instead: block-scaled FP8, one
power-of-two scale per 32 values, so its layers need multiples of 32.

FSDP2's float8 all-gather (the weights are cast to FP8 before the all-gather, halving its
bytes) and torchao's Float8 TP styles (FP8 sequence-parallel traffic) are tensorwise
features that move FP8 tensors through collectives: NCCL carries them, gloo fails
(`Invalid scalar type`), so a CPU run gathers bf16 weights and runs the plain TP styles
around the same FP8 layers. run.json records which.

On a CPU `torch._scaled_mm` runs the FP8 GEMMs in software: the numerics are FP8's (the
same casts, scales and saturation), the speed says nothing about an FP8 GPU.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from ...plan import Plan
from ..models.moe import moe_layers

FP8_DIM_MULTIPLE = 16
"""FP8 GEMMs (cuBLAS/CUTLASS _scaled_mm) need both weight dimensions to be multiples of 16."""
MX_BLOCK = 32
"""MXFP8 scales blocks of 32 values along the contraction dimension, which is each weight
dimension in turn (forward, input gradient, weight gradient)."""


def _require_torchao(mx: bool = False):

    # torchao's wheel carries CUDA kernels (_C*.so) and warns on import for each one that
    # cannot load; a CPU uses none of them, so the warnings would only alarm (on a GPU
    # they stay: a kernel that fails to load there matters). Its enum registrations draw
    # a torch deprecation warning on every rank, which the launcher would read as a rank's
    # error output ("[rank0]:W...") and copy every later line into the log again.
    quiet = ["torch.utils._pytree"] + (["torchao"] if not torch.cuda.is_available() else [])
    levels = {name: logging.getLogger(name).level for name in quiet}
    for name in quiet:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import torchao.float8  # noqa: F401
        if mx:
            import torchao.prototype.moe_training.config  # noqa: F401
    except ImportError:
        raise RuntimeError("--dtype fp8 needs torchao: pip install 'trainbench[fp8]'") from None
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def float8_all_gather(plan: Plan, backend: str) -> bool:
    """FSDP2 all-gathers FP8 weights only with tensorwise scaling (torchao supports no
    other) and only on NCCL (gloo has no float8 collectives)."""
    return plan.dtype == "fp8" and plan.fp8_recipe == "tensorwise" and backend == "nccl"


def float8_config(plan: Plan, backend: str):
    _require_torchao()
    from torchao.float8 import Float8LinearConfig
    if plan.fp8_recipe == "tensorwise":
        return Float8LinearConfig(enable_fsdp_float8_all_gather=float8_all_gather(plan, backend))
    return Float8LinearConfig.from_recipe_name(plan.fp8_recipe)


def eligible(module: nn.Module, fqn: str, tp: int = 1, multiple: int = FP8_DIM_MULTIPLE) -> bool:
    """Whether a layer runs in FP8: a Linear other than the output head whose dimensions,
    after a TP split of up to `tp` ways, stay multiples of `multiple` (16; 32 for MXFP8)."""
    multiple *= tp
    # The MoE router stays in high precision, as the output head does (DeepSeek-V3
    # technical report, sec. 3.3.1: embedding, output head and MoE gating keep BF16/FP32).
    return (isinstance(module, nn.Linear) and fqn.rsplit(".", 1)[-1] not in ("output", "router")
            and module.in_features % multiple == 0 and module.out_features % multiple == 0)


def convert(model: nn.Module, plan: Plan, backend: str) -> None:
    """Convert `model` (on the meta device, before TP and FSDP) in place, and mark the
    converted layers (`lowp_linear`) for run.json."""
    _require_torchao(mx=plan.dtype == "mxfp8")
    tp = plan.layout.tp
    if plan.dtype == "mxfp8":
        chosen = [m for name, m in model.named_modules() if eligible(m, name, tp, MX_BLOCK)]
        convert_mxfp8(model, backend, lambda m, fqn: eligible(m, fqn, tp, MX_BLOCK))
        wrap_experts(model, "mxfp8", backend)
    else:
        from torchao.float8 import convert_to_float8_training
        convert_to_float8_training(model, config=float8_config(plan, backend),
                                   module_filter_fn=lambda m, fqn: eligible(m, fqn, tp))
        chosen = [m for m in model.modules() if is_float8_linear(m)]
        # Tensorwise only: the rowwise recipe's backward casts the input along the other
        # axis, not as the forward did, so it keeps the bf16 input (float8_input.py), as
        # MXFP8's linears do (torchao's mxfp8_linear saves input_hp: its blocks of 32
        # run along the tokens for the weight gradient, along the features forward).
        # Imported here, as torchao is: float8_input subclasses torchao's Float8Linear
        # when it loads, and a bf16 run must start without torchao.
        from .float8_input import enable
        enable(model, plan)
        wrap_experts(model, "fp8", backend)
    for module in chosen:
        module.lowp_linear = True


def convert_mxfp8(model: nn.Module, backend: str, module_filter) -> None:
    """torchao's MX training (prototype in 0.18): each chosen Linear's weight becomes a
    wrapper tensor whose matmuls quantise both operands to MXFP8 (e4m3 values, e8m0
    block scales rounded up, RCEIL) in forward and backward. Blackwell runs the real
    kernels; elsewhere (a CPU) torchao's emulation, which quantises and dequantises in
    PyTorch and multiplies in bf16: the same numbers, none of the speed."""
    from torchao.quantization import quantize_
    quantize_(model, mx_config(backend), filter_fn=module_filter)


def mx_config(backend: str):
    """One MX training config for the linears and the experts (torchao wants every wrapper
    tensor of a model to share it). Dropless routing gives each expert any number of
    rows, and MX scales blocks of 32 along the rows in the experts' weight gradient: the
    engine pads each expert's group to a multiple of 32 (engine/models/moe.py
    pad_token_groups, no host read), so torchao's own padding
    (`pad_token_groups_for_grouped_mm`, which reads the group sizes on the host off
    Blackwell) stays off, as torchtitan leaves it."""
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe
    recipe = (MXFP8TrainingRecipe.MXFP8_RCEIL if backend == "nccl"
              else MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL)
    return replace(MXFP8TrainingOpConfig.from_recipe(recipe),
                   pad_token_groups_for_grouped_mm=False)


def fp8_expert_config():
    """torchao's FP8 rowwise grouped GEMM config for the experts. Its own token-group
    padding stays off: torchao 0.18's `_Float8GroupedMM` asserts that it is
    (`pad_token_groups_for_grouped_mm=True is not yet supported`); the engine pads each
    expert's group to a multiple of 16 instead (engine/models/moe.py pad_token_groups),
    without a host read, as torchtitan's token dispatcher does."""
    from torchao.prototype.moe_training.config import Float8TrainingOpConfig
    return Float8TrainingOpConfig(pad_token_groups_for_grouped_mm=False)


def wrap_experts(model: nn.Module, dtype: str, backend: str) -> None:
    """The routed experts' grouped GEMMs in low precision: each MoE layer's w1, w3 and w2
    become torchao's training wrappers, whose torch._grouped_mm quantises both operands
    (engine/models/moe.py grouped_swiglu takes that path for them on any device). Marks
    each converted layer with its recipe, for run.json.

    mxfp8: mx_config, shared with the linears; off Blackwell torchao's emulation.
    fp8: torchao's float8 grouped GEMM (rowwise scales, the only recipe it has): Triton
    kernels quantise, torch._scaled_grouped_mm multiplies, so CUDA only (plan validation
    refuses FP8 MoE on a CPU); fp8_expert_config. Either way grouped_swiglu pads the
    token groups (16 rows for FP8, 32 for MXFP8) and torchao's padding is off."""
    from torchao.prototype.moe_training.tensor import (Float8TrainingWeightWrapperTensor,
                                                       MXFP8TrainingWeightWrapperTensor)

    if dtype == "mxfp8":
        wrapper, config = MXFP8TrainingWeightWrapperTensor, mx_config(backend)
        recipe = "mxfp8 (torchao grouped GEMM)"
    else:
        wrapper = Float8TrainingWeightWrapperTensor
        config = fp8_expert_config()
        recipe = "fp8 rowwise (torchao grouped GEMM)"
    for moe in moe_layers(model):
        for name in ("w1", "w3", "w2"):
            weight = getattr(moe, name)
            setattr(moe, name, nn.Parameter(wrapper(weight.data, config),
                                            requires_grad=weight.requires_grad))
        moe.lowp_experts = recipe


def summary(model_parts: list[nn.Module], plan: Plan, backend: str) -> dict:
    """What ran, for run.json: the recipe, FP8 all-gather, the layers kept in bf16, and
    what the FP8 linears keep of their input for the backward (float8_input.py)."""
    from .float8_input import saved_input_summary  # torchao's subclass: see convert
    converted, experts, kept = 0, [], []
    for part in model_parts:
        for name, module in part.named_modules():
            if getattr(module, "lowp_experts", None):
                experts.append(module.lowp_experts)
            if getattr(module, "lowp_linear", False):
                converted += 1
            elif isinstance(module, nn.Linear):
                kept.append(name)
    recipe = "mxfp8 (e4m3, 32-value blocks, RCEIL scales)" if plan.dtype == "mxfp8" \
        else plan.fp8_recipe
    return {"recipe": recipe, "fsdp_float8_all_gather": float8_all_gather(plan, backend),
            "float8_linears": converted, "kept_in_bf16": kept,
            "float8_expert_layers": len(experts),
            "expert_recipe": experts[0] if experts else None,
            "float8_tp_styles": plan.layout.tp > 1 and float8_tp_comms(plan, backend),
            **(saved_input_summary(model_parts) if plan.dtype == "fp8"
               else {"saved_input": "bf16", "saved_input_fp8_linears": 0}),
            "emulated": backend != "nccl"}


def is_float8_linear(module: nn.Module) -> bool:
    try:
        from torchao.float8.float8_linear import Float8Linear
    except ImportError:
        return False
    return isinstance(module, Float8Linear)


def float8_tp_comms(plan: Plan, backend: str) -> bool:
    """torchao's Float8 TP styles: tensorwise scaling only, and NCCL only (they move FP8
    tensors through collectives, e.g. the sequence-parallel gradient all-gather in
    backward, which gloo refuses with `Invalid scalar type`)."""
    return plan.dtype == "fp8" and plan.fp8_recipe == "tensorwise" and backend == "nccl"


def tp_style(style, module: nn.Module, plan: Plan, backend: str):
    """The TP style a Float8Linear takes in place of a plain Colwise/RowwiseParallel.

    torchao's Float8 styles cast the layer's input to FP8 before the TP redistribution
    (and its output's gradient to FP8 before the backward one), so TP traffic around
    the layer moves in FP8. Where they cannot run (float8_tp_comms) the plain styles
    wrap the same Float8Linear: the GEMMs are FP8 alike, the TP traffic bf16; the
    rowwise recipe always takes them, as in torchtitan.
    """
    if (plan.dtype != "fp8" or not float8_tp_comms(plan, backend)
            or not is_float8_linear(module)):
        return style
    from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel
    for plain, fp8 in ((ColwiseParallel, Float8ColwiseParallel),
                       (RowwiseParallel, Float8RowwiseParallel)):
        if type(style) is plain:
            return fp8(input_layouts=style.input_layouts[0],
                       output_layouts=style.output_layouts[0],
                       use_local_output=style.use_local_output)
    return style


def after_optimizer_step(model_parts: list[nn.Module], plan: Plan, backend: str) -> None:
    """With FP8 all-gather, each weight's scale is computed once after the optimizer step
    (one all-reduce for all of them) instead of inside every all-gather."""
    if float8_all_gather(plan, backend):
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp
        for part in model_parts:
            precompute_float8_dynamic_scale_for_fsdp(part)
