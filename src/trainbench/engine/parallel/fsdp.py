"""FSDP2 over the data (and context) parallel ranks: each block, then the root.

Mixed precision lives here: parameters stay fp32 (the master weights the optimizer
updates), FSDP casts them to bf16 for compute and reduces gradients in fp32. A module
that must read its parameters in fp32 whatever the compute dtype (Mamba's SSMCore:
dt_bias, A_log, D) says so with `keep_fp32 = True` and becomes a unit of its own whose
policy gathers in fp32: FSDP2 casts every parameter of a unit to that unit's
param_dtype, so this is the only place where such parameters can stay fp32.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from .ep import fully_shard_experts


def fp32_units(module: nn.Module) -> list[nn.Module]:
    """Submodules of `module` that read their parameters in fp32 (`keep_fp32`)."""
    return [m for m in module.modules() if getattr(m, "keep_fp32", False)]


def keep_bf16_master_weights(model: nn.Module) -> None:
    """Store `model`'s parameters in bf16, as the only copy the optimizer updates
    (plan.master_weights = 'bf16'), but those of `keep_fp32` units. Before FP8 conversion,
    TP and FSDP, which all take the parameters' dtype as they find it; FSDP's bf16
    param_dtype then gathers them without a cast. Buffers (RoPE tables) keep their dtype."""
    fp32 = {id(p) for unit in fp32_units(model) for p in unit.parameters()}
    for param in model.parameters():
        if id(param) not in fp32:
            # In place: the Parameter object and what is set on it (_no_weight_decay) stay.
            param.data = param.data.to(torch.bfloat16)


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, compute_dtype: torch.dtype,
               reshard_after_forward: bool = True,
               moe_meshes: tuple[DeviceMesh, DeviceMesh] | None = None,
               prefetch: bool = True, reduce_dtype: torch.dtype = torch.float32
               ) -> nn.Module:
    """Shard `model` and record what was set in `model.fsdp_settings` (for run.json)."""
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=reduce_dtype)
    # Its inputs keep the dtype they come in (bf16 activations): only the parameters are
    # gathered in fp32, and the module computes in fp32 where it reads them.
    fp32_policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32,
                                       cast_forward_inputs=False)
    for unit in fp32_units(model) if compute_dtype != torch.float32 else []:
        fully_shard(unit, mesh=mesh, mp_policy=fp32_policy,
                    reshard_after_forward=reshard_after_forward)
    layers = getattr(model, "layers", None)
    if layers is not None:
        blocks = list(layers.values())
        for index, block in enumerate(blocks):
            if moe_meshes is not None:  # see parallelize.moe_fsdp_meshes and ep.py
                fully_shard_experts(block, *moe_meshes, policy, reshard_after_forward)
            # The last block's backward starts right after its forward (only the head and
            # loss come between): resharding it would cost an all-gather for nothing.
            # `prefetch=False` keeps FSDP2's defaults throughout (the engine before).
            fully_shard(block, mesh=mesh, mp_policy=policy,
                        reshard_after_forward=reshard_after_forward
                        and (index < len(blocks) - 1 or not prefetch))
    # The root unit holds the embedding, final norm and output head. Its parameters are
    # needed again at once for backward, so keeping them gathered saves an all-gather.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    # FSDP2 on its own overlaps one all-gather ahead in forward only when the CPU runs
    # ahead of the GPU, and its backward prefetch follows the recorded forward order.
    # Naming the next (forward) and previous (backward) block makes the all-gather of
    # block i+1 / i-1 start before block i computes, whatever the CPU does. Without a
    # reshard after forward (a pipeline, dp_sharding=gradients|optimizer) the weights stay gathered
    # from the forward on: only the step's first forward has anything to prefetch.
    explicit = prefetch and layers is not None and len(blocks) > 1
    backward = explicit and reshard_after_forward
    if explicit:
        for index, block in enumerate(blocks):
            if index + 1 < len(blocks):
                block.set_modules_to_forward_prefetch([blocks[index + 1]])
            if index > 0 and backward:
                block.set_modules_to_backward_prefetch([blocks[index - 1]])
    model.fsdp_settings = {
        "forward_prefetch": "next block" if explicit else "FSDP2 default",
        "backward_prefetch": ("previous block" if backward
                              else "none (weights kept gathered)" if explicit
                              else "FSDP2 default"),
        "reshard_after_forward": ("none" if not reshard_after_forward
                                  else "all blocks but the last" if prefetch
                                  else "all blocks") + "; root kept gathered",
        "param_dtype": str(compute_dtype).removeprefix("torch."),
        "reduce_dtype": str(reduce_dtype).removeprefix("torch."),
    }
    return model
