"""FSDP2 over the data (and context) parallel ranks: each block, then the root.

Mixed precision lives here: parameters stay fp32 (the master weights the optimizer
updates), FSDP casts them to bf16 for compute and reduces gradients in fp32.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, compute_dtype: torch.dtype,
               reshard_after_forward: bool = True) -> nn.Module:
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    layers = getattr(model, "layers", None)
    if layers is not None:
        for block in layers.values():
            fully_shard(block, mesh=mesh, mp_policy=policy,
                        reshard_after_forward=reshard_after_forward)
    # The root unit holds the embedding, final norm and output head. Its parameters are
    # needed again at once for backward, so keeping them gathered saves an all-gather.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    return model
