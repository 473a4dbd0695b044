"""FP8 linears that keep the FP8 cast of their input for the backward, not the bf16 input.

torchao's Float8Linear (0.18, `matmul_with_hp_or_float8_args`) saves its high-precision
input and casts it to FP8 again in the backward, for the weight gradient. Under the
tensorwise recipe that second cast (`cast_config_input_for_grad_weight`) is the forward's
own cast (`cast_config_input`): e4m3, one scale from the amax of the same tensor. Keeping
the forward's FP8 tensor (1 B an element) in place of the bf16 input (2 B) therefore
gives the same weight gradient bit for bit, and it is what Transformer Engine keeps.
torchao's backward already skips the cast of an input that arrives in FP8
(`tensor_already_casted_to_fp8`), and the cast's own backward passes the gradient
through unchanged, so casting the input before torchao's autograd function is all it
takes: the function then saves the FP8 tensor (torchao's Float8ColwiseParallel hands it
an FP8 input the same way).

The rowwise recipe and MXFP8 stay as torchao runs them: their weight-gradient GEMM scales
the input along the token axis (per column, or per 32-token block), the forward along
the feature axis, so the backward's cast is a different one and there is no FP8 copy to
reuse. `reuses_forward_cast` checks the config itself, so a recipe whose casts differ
never takes this path.

Which tensors this really frees (FP8_KEEPERS, `keeps_fp8_input`):
- Linears that read one tensor (q, k and v the norm's output; SwiGLU's gate and up) share
  one cast (`shared_cast`): three FP8 copies (3 B) would cost more than the one bf16
  tensor (2 B) they replace. The norm's output is then kept by nobody else (the engine
  reruns norms in the backward from their input: parallel.keep_only_inputs_of_cheap_ops),
  so 2 B become 1 B; the same for the MLP's down projection (the activation reruns from
  gate and up) and Mamba-2's out_proj (the mixer reruns from in_proj's output).
- The attention out-projection reads the core's output, which the core (SDPA) keeps for
  its own backward: its input is a view of it and costs nothing more, an FP8 copy would
  cost 1 B. It keeps FP8 only where the core's output is not kept: selective recompute
  (the core reruns) and context parallelism (the engine's all-gather CP concatenates the
  chunks' outputs into a new tensor, the projection's input alone).
- An MoE layer's input is kept in bf16 by its router (a bf16 linear): the shared
  expert's gate and up keep bf16 too.
- Under sequence parallelism the linears that read the gathered sequence keep nothing of
  it: GatherSequence (parallel/tp.py) keeps the shard and gathers the sequence again in
  the backward; an FP8 copy of the whole sequence would add 1 B where it keeps 0.

Under torch.compile a compiled block saves what AOTAutograd's partitioner chooses from
the whole block's graph, where the forward's and the backward's casts of one input are the
same ops: these layers run torchao's own forward there (the cache below is eager state).
"""

from __future__ import annotations

import weakref

import torch
from torch import nn
from torch.utils.weak import WeakTensorKeyDictionary

from ...plan import Plan
from ..models.moe import moe_layers

LAYER_INPUT_LINEARS = frozenset({"wq", "wk", "wv", "w1", "w3", "in_proj", "wq_a", "wkv_a"})
"""Linears that read their attention's, MLP's or Mamba mixer's input (the norm's output),
which sequence parallelism all-gathers in front of them."""

_casts: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
"""bf16 input -> (its version, the cast's settings, a weak reference to its FP8 cast).

Keyed weakly by the input and holding the cast weakly: the cast lives exactly as long as a
linear's saved tensors hold it, so a cast whose consumers saved nothing (inside an
activation checkpoint, which drops what they save) is made again, not kept alive here."""


def reuses_forward_cast(config) -> bool:
    """Whether the backward's cast of the input for the weight gradient is the forward's
    cast: one dynamic scale per tensor, the same target dtype (the tensorwise recipe)."""
    from torchao.float8.config import ScalingGranularity, ScalingType
    cast = config.cast_config_input
    return (cast == config.cast_config_input_for_grad_weight
            and cast.scaling_type is ScalingType.DYNAMIC
            and cast.scaling_granularity is ScalingGranularity.TENSORWISE)


def keeps_fp8_input(fqn: str, plan: Plan, moe_shared_inputs: frozenset[str]) -> bool:
    """Whether the FP8 linear `fqn` keeping its input's FP8 cast frees that input's bf16
    copy (module docstring); `moe_shared_inputs`: the MoE shared experts' gate and up."""
    name = fqn.rsplit(".", 1)[-1]
    if fqn in moe_shared_inputs:
        return False
    if name == "wo":
        return plan.recompute == "selective" or plan.layout.cp > 1
    if plan.layout.tp > 1 and plan.sequence_shard_kept and name in LAYER_INPUT_LINEARS:
        return False
    return True


def enable(model: nn.Module, plan: Plan) -> int:
    """Make the Float8Linears of `model` whose bf16 input this frees keep their input's FP8
    cast (tensorwise configs only); returns how many."""
    from torchao.float8.float8_linear import Float8Linear

    moes = set(moe_layers(model))
    shared = frozenset(f"{name}.shared.{proj}" for name, moe in model.named_modules()
                       if moe in moes and moe.shared is not None for proj in ("w1", "w3"))
    count = 0
    for fqn, module in model.named_modules():
        if (type(module) is Float8Linear and reuses_forward_cast(module.config)
                and keeps_fp8_input(fqn, plan, shared)):
            module.__class__ = Float8LinearKeepingFP8Input
            count += 1
    return count


def saved_input_summary(model_parts: list[nn.Module]) -> dict:
    """What the FP8 linears keep of their input for the backward, for run.json: `fp8`,
    `bf16`, or both (FP8 where that frees the bf16 input), and how many keep FP8."""
    from torchao.float8.float8_linear import Float8Linear
    kinds = [isinstance(m, Float8LinearKeepingFP8Input) for part in model_parts
             for m in part.modules() if isinstance(m, Float8Linear)]
    form = ("bf16" if not any(kinds) else "fp8" if all(kinds)
            else "fp8 where that frees the bf16 input, bf16 elsewhere")
    return {"saved_input": form, "saved_input_fp8_linears": sum(kinds)}


def shared_cast(x: torch.Tensor, linear) -> torch.Tensor:
    """`x` cast to FP8 as `linear` casts its input, made once for all the linears that read
    the same `x` (unchanged since: the same version) with the same settings."""
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import GemmInputRole
    c = linear.config
    settings = (c.cast_config_input, c.round_scales_to_power_of_2, linear.linear_mm_config)
    entry = _casts.get(x)
    if entry is not None and entry[0] == x._version and entry[1] == settings:
        cast = entry[2]()
        if cast is not None:
            return cast
    cast = hp_tensor_to_float8_dynamic(
        x, c.cast_config_input.target_dtype, linear.linear_mm_config,
        gemm_input_role=GemmInputRole.INPUT,
        scaling_granularity=c.cast_config_input.scaling_granularity,
        axiswise_dim=None, round_scales_to_power_of_2=c.round_scales_to_power_of_2)
    _casts[x] = (x._version, settings, weakref.ref(cast))
    return cast


def _float8_linear():
    from torchao.float8.float8_linear import Float8Linear
    return Float8Linear


class Float8LinearKeepingFP8Input(_float8_linear()):
    """torchao's Float8Linear whose input reaches torchao's autograd function already cast
    (shared_cast), so that the FP8 tensor is what it saves for the backward."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        from torchao.float8.distributed_utils import tensor_already_casted_to_fp8
        from torchao.float8.float8_linear import matmul_with_hp_or_float8_args
        if (not torch.is_grad_enabled() or torch.is_autocast_enabled()
                or torch.compiler.is_compiling() or tensor_already_casted_to_fp8(input)):
            return super().forward(input)
        output = matmul_with_hp_or_float8_args.apply(
            shared_cast(input, self), self.weight.t(), self.linear_mm_config, self.config)
        if self.bias is not None:
            output = output + self.bias.to(output.dtype)
        return output
