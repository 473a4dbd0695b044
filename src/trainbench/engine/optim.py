"""AdamW with the usual weight-decay groups, and the warm-up + cosine schedule."""

from __future__ import annotations

import math

import torch
from torch import nn


def build_optimizer(model: nn.Module, lr: float, weight_decay: float = 0.1) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        # Norm gains, biases and Mamba's dt_bias/A_log/D take no weight decay.
        if param.ndim < 2 or getattr(param, "_no_weight_decay", False):
            no_decay.append(param)
        else:
            decay.append(param)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    kind = implementation(decay + no_decay)
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8,
                             **{kind: True})


def implementation(params: list[torch.Tensor]) -> str:
    """'fused' when every parameter is on CUDA: one kernel per dtype/device group updates
    all parameters (torchtitan's default), against a few kernels per step of the whole
    optimizer for 'foreach' and one per parameter for neither. 'foreach' elsewhere
    (the CPU): torch's fused CPU AdamW is not what the seed recipes run, and foreach is
    the tested path here. DTensor parameters (FSDP2, TP) report their local device."""
    return "fused" if params and all(p.device.type == "cuda" for p in params) else "foreach"


def describe(optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer as run.json records it."""
    d = optimizer.defaults
    kind = "fused" if d.get("fused") else "foreach" if d.get("foreach") else "for-loop"
    return {"name": type(optimizer).__name__, "implementation": kind, "betas": list(d["betas"]),
            "eps": d["eps"], "weight_decay": [g["weight_decay"] for g in optimizer.param_groups]}


def lr_at(step: int, max_lr: float, min_lr: float, warmup: int, decay_steps: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine to min_lr at `decay_steps`.

    NeMo's recipes warm up over 2000 steps, so a 50-step benchmark runs entirely in the
    warm-up (the seeds' logs show lr 7.5e-6 = 3e-4 * 50 / 2000 at step 49).
    """
    if warmup > 0 and step < warmup:
        return max_lr * (step + 1) / warmup
    span = max(1, decay_steps - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))
