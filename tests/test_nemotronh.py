"""Nemotron-H, the hybrid model: its size against the catalog, its layer pattern,
causality, pipeline-stage form, meta-device build, and a short training run on CPU."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from helpers import assert_every_parameter_trained
from trainbench.catalog.models import get_model, parameter_count
from trainbench.engine.models.mamba2 import Mamba2Mixer
from trainbench.engine.models.nemotronh import NemotronH
from trainbench.engine.models.transformer import MLP, Attention

TINY = get_model("pretrain_nemotronh", "tiny")
BIG = get_model("pretrain_nemotronh", "56b")


def test_56b_parameter_count_matches_the_catalog():
    with torch.device("meta"):
        model = NemotronH(BIG)
    counted = sum(p.numel() for p in model.parameters())
    assert counted == parameter_count(BIG)
    assert round(counted / 1e9, 1) == 56.3


def test_layers_follow_the_pattern():
    with torch.device("meta"):
        model = NemotronH(BIG)
    kinds = {Mamba2Mixer: "M", Attention: "*", MLP: "-"}
    built = "".join(kinds[type(layer.mixer)] for layer in model.layers.values())
    assert built == BIG.pattern
    assert (built.count("M"), built.count("*"), built.count("-")) == (54, 10, 54)
    assert list(model.layers.keys()) == [str(i) for i in range(118)]


def test_refuses_a_spec_with_position_embedding():
    with pytest.raises(ValueError, match="no position embedding"):
        NemotronH(dataclasses.replace(TINY, position_embedding="rope"))


def test_tiny_forward_backward_reaches_every_parameter():
    torch.manual_seed(0)
    model = NemotronH(TINY)
    tokens = torch.randint(0, TINY.vocab_size, (2, 45))
    logits = model(tokens)
    assert logits.shape == (2, 45, TINY.vocab_size)
    F.cross_entropy(logits.flatten(0, 1), tokens.roll(-1, 1).flatten()).backward()
    assert_every_parameter_trained(model)


def test_model_is_causal():
    torch.manual_seed(0)
    model = NemotronH(TINY)
    tokens = torch.randint(0, TINY.vocab_size, (1, 70))
    changed = tokens.clone()
    t = 50
    changed[0, t] = (tokens[0, t] + 1) % TINY.vocab_size
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(after[:, :t], before[:, :t], atol=0.0, rtol=0.0)
    assert (after[:, t:] - before[:, t:]).abs().amax(-1).min() > 0


def test_pipeline_stages_compose_to_the_full_model():
    """Dropping layers and setting tok_embeddings/norm/output to None gives stages that
    hand hidden states on and keep the full model's parameter names."""
    torch.manual_seed(0)
    full = NemotronH(TINY)
    first, second = NemotronH(TINY), NemotronH(TINY)
    first.load_state_dict(full.state_dict())
    second.load_state_dict(full.state_dict())
    split = 3
    for i in range(split, TINY.layers):
        del first.layers[str(i)]
    for i in range(split):
        del second.layers[str(i)]
    first.norm = first.output = None
    second.tok_embeddings = None
    names = set(dict(first.named_parameters())) | set(dict(second.named_parameters()))
    assert names == set(dict(full.named_parameters()))

    tokens = torch.randint(0, TINY.vocab_size, (2, 40))
    with torch.no_grad():
        hidden = first(tokens)
        assert hidden.shape == (2, 40, TINY.hidden)
        torch.testing.assert_close(second(hidden), full(tokens), atol=1e-5, rtol=1e-5)


def test_meta_build_then_init_equals_a_direct_build():
    """init_weights alone sets every parameter: after to_empty the values are garbage,
    and the same seed must give exactly the model built directly on the CPU."""
    with torch.device("meta"):
        model = NemotronH(TINY)
    model.to_empty(device="cpu")
    torch.manual_seed(1)
    model.init_weights()
    direct = NemotronH(TINY)
    torch.manual_seed(1)
    direct.init_weights()
    for (name, got), (_, want) in zip(model.named_parameters(), direct.named_parameters()):
        torch.testing.assert_close(got, want, atol=0.0, rtol=0.0, msg=name)
    marked = {n for n, p in model.named_parameters() if getattr(p, "_no_weight_decay", False)}
    assert marked == {f"layers.{i}.mixer.ssm.{name}" for i, kind in enumerate(TINY.pattern)
                      if kind == "M" for name in ("dt_bias", "A_log", "D")}


def strided_sequences(gen: torch.Generator, batch: int, length: int, vocab: int) -> torch.Tensor:
    """Arithmetic sequences mod vocab with a random start and a stride of 1, 2 or 3:
    the next token follows from the two before it, so a model that mixes tokens learns
    it, and one that does not cannot get below log(3) nats."""
    start = torch.randint(0, vocab, (batch, 1), generator=gen)
    stride = torch.randint(1, 4, (batch, 1), generator=gen)
    return (start + stride * torch.arange(length)) % vocab


def test_tiny_model_learns_a_synthetic_task_in_50_steps(one_thread):
    torch.manual_seed(0)
    model = NemotronH(TINY)
    params = list(model.parameters())
    no_decay = [p for p in params if getattr(p, "_no_weight_decay", False)]
    decay = [p for p in params if not getattr(p, "_no_weight_decay", False)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(50):
        seq = strided_sequences(gen, batch=8, length=49, vocab=TINY.vocab_size)
        logits = model(seq[:, :-1])  # 48 tokens: a chunk of 32 and a padded one
        loss = F.cross_entropy(logits.flatten(0, 1), seq[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    # Starts at chance (log 512 = 6.24 nats). The last five steps must average under a
    # quarter of that and under log 3, the floor of any model that ignores context
    # (measured: 0.48).
    assert abs(losses[0] - math.log(TINY.vocab_size)) < 0.3
    final = sum(losses[-5:]) / 5
    assert final < losses[0] / 4 and final < math.log(3), losses
