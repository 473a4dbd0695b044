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


def fp32_units(module: nn.Module) -> list[nn.Module]:
    """Submodules of `module` that read their parameters in fp32 (`keep_fp32`)."""
    return [m for m in module.modules() if getattr(m, "keep_fp32", False)]


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, compute_dtype: torch.dtype,
               reshard_after_forward: bool = True, expert_dp: tuple | None = None
               ) -> nn.Module:
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    # Its inputs keep the dtype they come in (bf16 activations): only the parameters are
    # gathered in fp32, and the module computes in fp32 where it reads them.
    fp32_policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32,
                                       cast_forward_inputs=False)
    for unit in fp32_units(model) if compute_dtype != torch.float32 else []:
        fully_shard(unit, mesh=mesh, mp_policy=fp32_policy,
                    reshard_after_forward=reshard_after_forward)
    layers = getattr(model, "layers", None)
    if layers is not None:
        for block in layers.values():
            if expert_dp is not None:  # (dp_mod_ep mesh, dp): see ep.py
                from .ep import fully_shard_experts
                fully_shard_experts(block, mesh, *expert_dp, policy, reshard_after_forward)
            fully_shard(block, mesh=mesh, mp_policy=policy,
                        reshard_after_forward=reshard_after_forward)
    # The root unit holds the embedding, final norm and output head. Its parameters are
    # needed again at once for backward, so keeping them gathered saves an all-gather.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    return model
