"""Turn a rank's meta-device model parts into real, initialised parameters."""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from ..plan import Plan
from .models import build_model


def materialize(model: torch.nn.Module, plan: Plan, device: torch.device) -> torch.nn.Module:
    """Allocate the sharded parameters and initialise them.

    On a CPU (small models by nature) the full model is initialised once from the seed
    and each rank keeps its shard, so every layout starts from bit-identical weights. On
    GPUs each shard is initialised in place (DTensor's CUDA RNG tracker keeps shards
    consistent) and the full model never exists on one device.
    """
    model.to_empty(device=device)
    torch.manual_seed(plan.seed)
    with torch.no_grad():
        model.init_weights()
    if device.type == "cpu":
        torch.manual_seed(plan.seed)
        full = build_model(plan.model)
        with torch.no_grad():
            full.init_weights()
        wanted = {strip_wrappers(k) for k in model.state_dict()}
        # Every layout stores each parameter in the full model's order (TP and FSDP take
        # contiguous shards of it), so the full state dict loads as it is.
        full_sd = {k: v for k, v in full.state_dict().items() if strip_wrappers(k) in wanted}
        set_model_state_dict(model, full_sd,
                             options=StateDictOptions(full_state_dict=True, strict=False))
    return model


def strip_wrappers(fqn: str) -> str:
    """A parameter's name without the wrappers' prefixes (checkpointing, compile, FSDP)."""
    for prefix in ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module."):
        fqn = fqn.replace(prefix, "")
    return fqn
