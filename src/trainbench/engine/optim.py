"""AdamW with the usual weight-decay groups (its moments in fp32, or in bf16 as Megatron's
precision-aware optimizer keeps them), and the warm-up + cosine schedule."""

from __future__ import annotations

import math

import torch
from torch import nn


BETAS = (0.9, 0.95)
EPS = 1e-8


def build_optimizer(model: nn.Module, lr: float, weight_decay: float = 0.1,
                    moments: str = "fp32") -> torch.optim.Optimizer:
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
    if moments == "bf16":
        return AdamWBf16Moments(groups, lr=lr, betas=BETAS, eps=EPS)
    kind = implementation(decay + no_decay)
    return torch.optim.AdamW(groups, lr=lr, betas=BETAS, eps=EPS, **{kind: True})


class AdamWBf16Moments(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, bias-corrected moments) whose two moments are
    stored in bf16: 4 B of optimizer state per parameter instead of 8. Each step computes
    the moments in fp32 from the stored ones, updates the weights with those, and stores
    them rounded to bf16, as Megatron's precision-aware optimizer does. The weights are
    fp32 master weights, or bf16 ones kept as the only copy (plan.master_weights, Apex's
    bf16-state Adam): those are updated in fp32 and rounded once. Nothing is read on the
    host but the step count, which lives on the CPU."""

    def __init__(self, params, lr: float, betas: tuple[float, float] = BETAS,
                 eps: float = EPS, weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group, beta1, beta2)
        return None

    def _update(self, param: torch.Tensor, group: dict, beta1: float, beta2: float) -> None:
        state = self.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(param, dtype=torch.bfloat16)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.bfloat16)
        state["step"] += 1
        step = float(state["step"])  # a CPU tensor: no device sync
        grad = param.grad.to(torch.float32)
        exp_avg = state["exp_avg"].to(torch.float32).lerp_(grad, 1 - beta1)
        exp_avg_sq = state["exp_avg_sq"].to(torch.float32).mul_(beta2)
        exp_avg_sq.addcmul_(grad, grad, value=1 - beta2)
        state["exp_avg"].copy_(exp_avg)
        state["exp_avg_sq"].copy_(exp_avg_sq)
        lr = group["lr"]
        weight = param if param.dtype == torch.float32 else param.to(torch.float32)
        weight.mul_(1 - lr * group["weight_decay"])
        denom = (exp_avg_sq / (1 - beta2 ** step)).sqrt_().add_(group["eps"])
        weight.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1 ** step))
        if weight is not param:
            param.copy_(weight)


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
    moments = "bf16" if isinstance(optimizer, AdamWBf16Moments) else "fp32"
    # What the parameters it updates really are (bf16 master weights keep Mamba-2's fp32).
    masters = sorted({str(p.dtype).removeprefix("torch.") for g in optimizer.param_groups
                      for p in g["params"]})
    return {"name": "AdamW", "implementation": kind, "betas": list(d["betas"]),
            "eps": d["eps"], "weight_decay": [g["weight_decay"] for g in optimizer.param_groups],
            "moments": moments, "master_weights": "/".join(masters)}


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
