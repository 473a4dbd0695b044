"""Nemotron-H: the hybrid Mamba-2 / attention / MLP decoder.

Each character of `spec.pattern` is one pre-norm residual block, x + mixer(norm(x)):
'M' a Mamba-2 mixer (mamba2.py), '*' causal grouped-query self-attention with no
position embedding at all, '-' a squared-ReLU MLP. Token embedding in front, a final
norm and an untied output head behind (../shared/reference/architectures.md).

Same conventions as transformer.py, whose RMSNorm, Attention and MLP it reuses: no
parallelism in here; `layers` is a ModuleDict keyed by the global layer index;
`tok_embeddings`, `norm` and `output` may be None on a pipeline stage; build on the
meta device, shard, then `to_empty(device=...)` and `init_weights()`.
"""

from __future__ import annotations


import torch
from torch import nn

from trainbench.catalog.hybrid import LAYER_KINDS
from trainbench.catalog.models import ModelSpec
from trainbench.engine.models.mamba2 import Mamba2Mixer
from trainbench.engine.models.transformer import MLP, Attention, build_norm, init_trunk_weights


class HybridBlock(nn.Module):
    """One pattern character: x + mixer(norm(x)), the mixer chosen by `kind`."""

    def __init__(self, spec: ModelSpec, kind: str):
        super().__init__()
        if kind not in LAYER_KINDS:
            raise ValueError(
                f"unknown layer kind {kind!r} in pattern; expected one of {''.join(LAYER_KINDS)}")
        self.kind = kind
        self.norm = build_norm(spec)
        self.mixer: nn.Module
        if kind == "M":
            self.mixer = Mamba2Mixer(spec)
        elif kind == "*":
            self.mixer = Attention(spec)
        else:
            self.mixer = MLP(spec.hidden, spec.ffn, spec.mlp)

    def init_weights(self, out_std: float) -> None:
        self.norm.reset_parameters()
        self.mixer.init_weights(out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        # Attention without rope: Nemotron-H's attention layers see no positions; order
        # reaches them through the causal mask and the Mamba layers before them.
        return x + (self.mixer(h, None) if self.kind == "*" else self.mixer(h))


class NemotronH(nn.Module):
    """Token embedding, one HybridBlock per pattern character, final norm, output head."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        if not spec.is_hybrid:
            raise ValueError(f"NemotronH needs a layer pattern; {spec.name} has none")
        if spec.position_embedding != "none":
            raise ValueError(
                f"Nemotron-H attention has no position embedding; {spec.name} has "
                f"position_embedding {spec.position_embedding!r}")
        if len(spec.pattern) != spec.layers:
            raise ValueError(
                f"{spec.name}: pattern has {len(spec.pattern)} characters but layers is "
                f"{spec.layers}")
        self.spec = spec
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(spec.vocab_size, spec.hidden)
        # Keyed by global index, so a pipeline stage that drops layers keeps the names.
        self.layers = nn.ModuleDict(
            {str(i): HybridBlock(spec, kind) for i, kind in enumerate(spec.pattern)})
        self.norm: nn.Module | None = build_norm(spec)
        self.output: nn.Linear | None = nn.Linear(spec.hidden, spec.vocab_size, bias=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter in place.

        Works on real tensors after `to_empty(device=...)` from the meta device (and is a
        no-op on meta tensors). Every residual branch's output projection (Mamba
        out_proj, attention wo, MLP w2) gets std 0.02/sqrt(2*layers), Megatron's scaled
        init with the hybrid's depth, taken from the spec so every pipeline stage
        initialises its layers alike.
        """
        init_trunk_weights(self, self.spec.layers)

    def forward(
        self, tokens_or_hidden: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Tokens [b, s] (or hidden states [b, s, hidden] on a later pipeline stage) ->
        logits [b, s, vocab] (hidden states if `output` is None).

        `positions` is accepted for the engine's common call and ignored: no layer of
        Nemotron-H uses positions, and its Mamba layers need the whole, contiguous
        sequence in order (no context parallelism for this model).
        """
        del positions
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens_or_hidden)
        else:
            h = tokens_or_hidden
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h
