"""Model modules of the seed workloads, built from a catalog `ModelSpec`."""

from __future__ import annotations

import torch
from torch import nn

from trainbench.catalog.models import ModelSpec
from trainbench.engine.models.deepseek_v3 import DeepSeekV3
from trainbench.engine.models.nemotronh import NemotronH
from trainbench.engine.models.qwen3_moe import Qwen3MoE
from trainbench.engine.models.transformer import Transformer


def build_model(spec: ModelSpec) -> nn.Module:
    """The module for `spec.family`, on the current default device.

    Build under `with torch.device("meta"):` to allocate nothing; materialise later with
    `to_empty(device=...)` followed by `init_weights()`.
    """
    if spec.family in ("llama", "nemotron4"):
        return Transformer(spec)
    if spec.family == "nemotronh":
        return NemotronH(spec)
    if spec.family == "qwen3_moe":
        return Qwen3MoE(spec)
    if spec.family == "deepseek_v3":
        return DeepSeekV3(spec)
    raise ValueError(
        f"unknown model family {spec.family!r}; expected 'llama', 'nemotron4', 'nemotronh', "
        "'qwen3_moe' or 'deepseek_v3'")


def count_parameters_meta(spec: ModelSpec) -> int:
    """Parameters of the real module for `spec`, counted on the meta device (no memory)."""
    with torch.device("meta"):
        model = build_model(spec)
    return sum(p.numel() for p in model.parameters())
