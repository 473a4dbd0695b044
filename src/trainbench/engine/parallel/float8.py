"""FP8 training through torchao, the same code on a GPU and on a CPU.

`convert` swaps the eligible nn.Linear layers for torchao's Float8Linear (the recipe
picks the scaling: `tensorwise`, one dynamic scale per tensor, NeMo's "current scaling";
`rowwise`, one per row, scales rounded to powers of two). Layers kept in bf16, on every
device alike: the output head (its logits feed the loss directly; torchtitan and NeMo keep
it in high precision) and any layer whose GEMM dimensions, as each TP rank holds them,
are not multiples of 16 (FP8 GEMMs need that; e.g. the tiny Nemotron-H's Mamba in_proj,
328 wide).

FSDP2's float8 all-gather (the weights are cast to FP8 before the all-gather, halving its
bytes) is a tensorwise feature that needs NCCL: on gloo it fails (`Invalid scalar type`),
so a CPU run gathers bf16 weights and casts after. The run records which.

On a CPU `torch._scaled_mm` runs the FP8 GEMMs in software: the numerics are FP8's (the
same casts, scales and saturation), the speed says nothing about an FP8 GPU.
"""

from __future__ import annotations

from torch import nn

from ...plan import Plan

FP8_DIM_MULTIPLE = 16
"""FP8 GEMMs (cuBLAS/CUTLASS _scaled_mm) need both weight dimensions to be multiples of 16."""


def _require_torchao():
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise RuntimeError("--dtype fp8 needs torchao: pip install 'trainbench[fp8]'") from None


def float8_all_gather(plan: Plan, backend: str) -> bool:
    """FSDP2 all-gathers FP8 weights only with tensorwise scaling (torchao supports no
    other) and only on NCCL (gloo has no float8 collectives)."""
    return plan.fp8_recipe == "tensorwise" and backend == "nccl"


def float8_config(plan: Plan, backend: str):
    _require_torchao()
    from torchao.float8 import Float8LinearConfig
    if plan.fp8_recipe == "tensorwise":
        return Float8LinearConfig(enable_fsdp_float8_all_gather=float8_all_gather(plan, backend))
    return Float8LinearConfig.from_recipe_name(plan.fp8_recipe)


def eligible(module: nn.Module, fqn: str, tp: int = 1) -> bool:
    """Whether a layer runs in FP8: a Linear other than the output head whose dimensions,
    after a TP split of up to `tp` ways, stay multiples of 16."""
    multiple = FP8_DIM_MULTIPLE * tp
    return (isinstance(module, nn.Linear) and fqn.rsplit(".", 1)[-1] != "output"
            and module.in_features % multiple == 0 and module.out_features % multiple == 0)


def convert(model: nn.Module, plan: Plan, backend: str) -> None:
    """Convert `model` (on the meta device, before TP and FSDP) in place."""
    from torchao.float8 import convert_to_float8_training
    tp = plan.layout.tp
    convert_to_float8_training(model, config=float8_config(plan, backend),
                               module_filter_fn=lambda m, fqn: eligible(m, fqn, tp))


def summary(model_parts: list[nn.Module], plan: Plan, backend: str) -> dict:
    """What ran, for run.json: the recipe, FP8 all-gather, and the layers kept in bf16."""
    converted, kept = 0, []
    for part in model_parts:
        for name, module in part.named_modules():
            if is_float8_linear(module):
                converted += 1
            elif isinstance(module, nn.Linear):
                kept.append(name)
    return {"recipe": plan.fp8_recipe, "fsdp_float8_all_gather": float8_all_gather(plan, backend),
            "float8_linears": converted, "kept_in_bf16": kept,
            "float8_tp_styles": plan.layout.tp > 1 and float8_tp_comms(plan, backend),
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
    return plan.fp8_recipe == "tensorwise" and backend == "nccl"


def tp_style(style, module: nn.Module, plan: Plan, backend: str):
    """The TP style a Float8Linear takes in place of a plain Colwise/RowwiseParallel.

    torchao's Float8 styles cast the layer's input to FP8 before the TP redistribution
    (and its output's gradient to FP8 before the backward one), so TP traffic around
    the layer moves in FP8. Where they cannot run (float8_tp_comms) the plain styles
    wrap the same Float8Linear: the GEMMs are FP8 alike, the TP traffic bf16; the
    rowwise recipe always takes them, as in torchtitan.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    if (plan.dtype != "fp8" or not float8_tp_comms(plan, backend)
            or not is_float8_linear(module)):
        return style
    from torchao.float8.float8_tensor_parallel import (Float8ColwiseParallel,
                                                       Float8RowwiseParallel)
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
    if plan.dtype == "fp8" and float8_all_gather(plan, backend):
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp
        for part in model_parts:
            precompute_float8_dynamic_scale_for_fsdp(part)
