"""The Mamba-2 mixer: the chunked SSD scan against the per-token recurrence, the mixer's
causality, init and tensor-parallel layout, and (on a GPU with mamba_ssm) the Triton
kernel against the torch scan."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from helpers import assert_every_parameter_trained
from trainbench.catalog.models import get_model
from trainbench.engine.models import mamba2
from trainbench.engine.models.mamba2 import (
    Mamba2Mixer,
    segsum,
    shard_indices,
    ssd_chunked,
    ssd_sequential,
)

TINY = get_model("pretrain_nemotronh", "tiny")

# fp32 chunked vs sequential: both accumulate in fp32 over at most 37 steps of O(1)
# terms, so they agree to a few ulps of the largest value; 1e-5 leaves ample room and
# still catches any wrong decay or misplaced chunk boundary (errors of order 1e-1).
ATOL, RTOL = 1e-5, 1e-4


def scan_inputs(batch=2, length=37, heads=4, head_dim=3, groups=2, state=5, seed=0):
    """Random scan inputs with realistic decays: A*dt in [-1, 0)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, heads, head_dim, generator=gen)
    dt_a = -torch.rand(batch, length, heads, generator=gen)
    b = torch.randn(batch, length, groups, state, generator=gen)
    c = torch.randn(batch, length, groups, state, generator=gen)
    h0 = torch.randn(batch, heads, head_dim, state, generator=gen)
    return x, dt_a, b, c, h0


def test_segsum_is_the_sum_between_positions():
    a = torch.randn(3, 6)
    out = segsum(a)
    for i in range(6):
        for j in range(6):
            if i >= j:
                torch.testing.assert_close(out[:, i, j], a[:, j + 1:i + 1].sum(-1))
            else:
                assert torch.isneginf(out[:, i, j]).all()


@pytest.mark.parametrize("chunk", [4, 8, 16])
@pytest.mark.parametrize("length", [13, 37])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_chunked_scan_matches_recurrence(chunk, length, with_state, groups):
    x, dt_a, b, c, h0 = scan_inputs(length=length, groups=groups)
    h0 = h0 if with_state else None
    y, final = ssd_chunked(x, dt_a, b, c, chunk, initial_state=h0)
    y_ref, final_ref = ssd_sequential(x, dt_a, b, c, initial_state=h0)
    assert y.shape == x.shape and final.shape == final_ref.shape
    torch.testing.assert_close(y, y_ref, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(final, final_ref, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("chunk,length", [(4, 13), (8, 37), (16, 37)])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunked_scan_gradients_match_recurrence(chunk, length, with_state):
    inputs = scan_inputs(length=length)
    gen = torch.Generator().manual_seed(1)
    w_y = torch.randn(inputs[0].shape, generator=gen)
    w_state = torch.randn(inputs[4].shape, generator=gen)

    def grads(scan):
        leaves = [t.clone().requires_grad_() for t in inputs]
        x, dt_a, b, c, h0 = leaves
        y, final = scan(x, dt_a, b, c, h0 if with_state else None)
        # Both outputs feed the loss, so gradients flow back through the final state too.
        ((y * w_y).sum() + (final * w_state).sum()).backward()
        return [t.grad for t in (leaves if with_state else leaves[:4])]

    got = grads(lambda x, a, b, c, h0: ssd_chunked(x, a, b, c, chunk, initial_state=h0))
    want = grads(lambda x, a, b, c, h0: ssd_sequential(x, a, b, c, initial_state=h0))
    for name, g, w in zip(["x", "dt_a", "B", "C", "initial_state"], got, want):
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, msg=f"gradient of {name}")


def test_chunked_scan_in_bf16_stays_close_to_fp32():
    x, dt_a, b, c, _ = scan_inputs(length=37)
    y_ref, _ = ssd_sequential(x, dt_a, b, c)
    y, final = ssd_chunked(x.bfloat16(), dt_a, b.bfloat16(), c.bfloat16(), 8)
    assert y.dtype == torch.bfloat16 and final.dtype == torch.float32
    # bf16 keeps 8 bits of mantissa: 3% of the output's scale.
    scale = y_ref.abs().max()
    assert (y.float() - y_ref).abs().max() < 0.03 * scale


def test_mixer_forward_backward_reaches_every_parameter():
    torch.manual_seed(0)
    mixer = Mamba2Mixer(TINY)
    hidden = torch.randn(2, 45, TINY.hidden, requires_grad=True)  # 45: not a chunk multiple
    out = mixer(hidden)
    assert out.shape == hidden.shape
    out.square().mean().backward()
    assert torch.isfinite(hidden.grad).all() and hidden.grad.abs().sum() > 0
    assert_every_parameter_trained(mixer)


def test_mixer_is_causal():
    torch.manual_seed(0)
    mixer = Mamba2Mixer(TINY)
    hidden = torch.randn(1, 70, TINY.hidden)
    changed = hidden.clone()
    t = 40  # inside the second chunk of 32
    changed[:, t] += 1.0
    with torch.no_grad():
        before, after = mixer(hidden), mixer(changed)
    torch.testing.assert_close(after[:, :t], before[:, :t], atol=0.0, rtol=0.0)
    assert (after[:, t:] - before[:, t:]).abs().amax(-1).min() > 0  # every later token sees it


def test_mixer_does_not_depend_on_the_chunk_length():
    torch.manual_seed(0)
    mixer = Mamba2Mixer(TINY)
    hidden = torch.randn(2, 50, TINY.hidden)
    with torch.no_grad():
        outs = []
        for chunk in (7, 32, 64):
            mixer.chunk = chunk
            outs.append(mixer(hidden))
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=1e-5, rtol=1e-4)


def test_init_after_meta_build_follows_mamba2():
    with torch.device("meta"):
        mixer = Mamba2Mixer(TINY)
    mixer.to_empty(device="cpu")
    torch.manual_seed(0)
    mixer.init_weights(out_std=0.01)
    dt = F.softplus(mixer.ssm.dt_bias)
    assert ((dt >= 1e-3 * (1 - 1e-5)) & (dt <= 1e-1 * (1 + 1e-5))).all()
    minus_a = torch.exp(mixer.ssm.A_log)
    for name in ("dt_bias", "A_log", "D"):
        assert getattr(mixer.ssm, name).dtype == torch.float32, name
    assert ((minus_a >= 1.0 - 1e-6) & (minus_a <= 16.0 + 1e-5)).all()
    assert (mixer.ssm.D == 1).all() and (mixer.norm_weight == 1).all()
    assert abs(mixer.out_proj.weight.std().item() - 0.01) < 0.002
    assert abs(mixer.in_proj.weight.std().item() - mamba2.INIT_STD) < 0.002
    for name, param in mixer.named_parameters():
        assert torch.isfinite(param).all(), name
        marked = getattr(param, "_no_weight_decay", False)
        assert marked == (name in ("ssm.dt_bias", "ssm.A_log", "ssm.D")), name


@pytest.mark.parametrize("world", [2, 4])
def test_shards_by_heads_and_groups_sum_to_the_full_mixer(world):
    """The tensor-parallel layout: each shard is a smaller, complete mixer holding the
    rows `shard_indices` names; their out_proj outputs sum to the full output."""
    spec = dataclasses.replace(TINY, mamba_groups=4)  # 8 heads, 4 groups
    torch.manual_seed(0)
    full = Mamba2Mixer(spec)
    hidden = torch.randn(2, 37, spec.hidden)
    shard_spec = dataclasses.replace(
        spec, mamba_heads=spec.mamba_heads // world, mamba_groups=spec.mamba_groups // world)
    total = torch.zeros_like(hidden)
    with torch.no_grad():
        for rank in range(world):
            idx = shard_indices(spec.mamba_heads, spec.mamba_groups, spec.mamba_head_dim,
                                spec.mamba_state, rank, world)
            # What tensor parallelism relies on: each is the rank-th of `world` equal,
            # contiguous blocks of the full model's order (DTensor's Shard(0)).
            for key, full_size in (("in_proj", full.in_proj.weight.shape[0]),
                                   ("conv", full.conv1d.weight.shape[0]),
                                   ("heads", spec.mamba_heads),
                                   ("inner", full.norm_weight.shape[0])):
                size = full_size // world
                assert idx[key].tolist() == list(range(rank * size, (rank + 1) * size)), key
            shard = Mamba2Mixer(shard_spec)
            shard.in_proj.weight.copy_(full.in_proj.weight[idx["in_proj"]])
            shard.conv1d.weight.copy_(full.conv1d.weight[idx["conv"]])
            shard.conv1d.bias.copy_(full.conv1d.bias[idx["conv"]])
            for name in ("dt_bias", "A_log", "D"):
                getattr(shard.ssm, name).copy_(getattr(full.ssm, name)[idx["heads"]])
            shard.norm_weight.copy_(full.norm_weight[idx["inner"]])
            shard.out_proj.weight.copy_(full.out_proj.weight[:, idx["inner"]])
            total += shard(hidden)
        torch.testing.assert_close(total, full(hidden), atol=1e-5, rtol=1e-4)


def reference_forward(mixer: Mamba2Mixer, hidden: torch.Tensor) -> torch.Tensor:
    """The mixer as ../shared/reference/architectures.md writes it, with in_proj's
    outputs in the reference order (z, x, B, C, dt, each over all heads or groups) and
    the per-token recurrence as the scan. The mixer's own weights are read through the
    row permutation from that order to the mixer's group-major one, written out here
    independently of the mixer's code."""
    H, G, P, N = mixer.n_heads, mixer.n_groups, mixer.head_dim, mixer.state_size
    hg = H // G
    per_group, conv_per_group = 2 * hg * P + 2 * N + hg, hg * P + 2 * N
    z_rows = [h // hg * per_group + h % hg * P + p for h in range(H) for p in range(P)]
    x_rows = [h // hg * per_group + hg * P + h % hg * P + p for h in range(H) for p in range(P)]
    b_rows = [g * per_group + 2 * hg * P + n for g in range(G) for n in range(N)]
    c_rows = [g * per_group + 2 * hg * P + N + n for g in range(G) for n in range(N)]
    dt_rows = [h // hg * per_group + 2 * hg * P + 2 * N + h % hg for h in range(H)]
    conv_x = [h // hg * conv_per_group + h % hg * P + p for h in range(H) for p in range(P)]
    conv_b = [g * conv_per_group + hg * P + n for g in range(G) for n in range(N)]
    conv_c = [g * conv_per_group + hg * P + N + n for g in range(G) for n in range(N)]
    in_rows = z_rows + x_rows + b_rows + c_rows + dt_rows
    conv_rows = conv_x + conv_b + conv_c
    assert sorted(in_rows) == list(range(mixer.in_proj.weight.shape[0]))  # a permutation
    assert sorted(conv_rows) == list(range(mixer.conv1d.weight.shape[0]))

    batch, length, _ = hidden.shape
    proj = hidden @ mixer.in_proj.weight[in_rows].T
    z, xbc, dt = torch.split(proj, [H * P, H * P + 2 * G * N, H], dim=-1)
    k = mixer.conv1d.weight.shape[-1]
    xbc = F.conv1d(F.pad(xbc.transpose(1, 2), (k - 1, 0)), mixer.conv1d.weight[conv_rows],
                   mixer.conv1d.bias[conv_rows], groups=xbc.shape[-1]).transpose(1, 2)
    x, b, c = torch.split(F.silu(xbc), [H * P, G * N, G * N], dim=-1)
    x = x.reshape(batch, length, H, P)
    dt = F.softplus(dt + mixer.ssm.dt_bias)
    a = -torch.exp(mixer.ssm.A_log)
    y, _ = ssd_sequential(x * dt[..., None], a * dt, b.reshape(batch, length, G, N),
                          c.reshape(batch, length, G, N))
    y = (y + x * mixer.ssm.D[:, None]).reshape(batch, length, H * P)
    gated = (y * F.silu(z)).reshape(batch, length, G, -1)
    normed = gated * torch.rsqrt(gated.pow(2).mean(-1, keepdim=True) + mixer.eps)
    return normed.reshape(batch, length, -1) * mixer.norm_weight @ mixer.out_proj.weight.T


def test_mixer_is_the_reference_mixer_with_rows_grouped():
    """The group-major storage order is a permutation of the reference's rows, nothing
    more: the same weights, read in the reference order, give the same output."""
    spec = dataclasses.replace(TINY, mamba_groups=4)
    torch.manual_seed(0)
    mixer = Mamba2Mixer(spec)
    with torch.no_grad():  # non-trivial values where init sets constants
        mixer.ssm.D.uniform_(0.5, 1.5)
        mixer.norm_weight.uniform_(0.5, 1.5)
    hidden = torch.randn(2, 37, spec.hidden)
    with torch.no_grad():
        torch.testing.assert_close(mixer(hidden), reference_forward(mixer, hidden),
                                   atol=1e-5, rtol=1e-4)


def test_shard_count_must_divide_the_groups():
    with pytest.raises(ValueError, match="must divide the group count"):
        shard_indices(8, 2, 16, 16, 0, 4)


def _kernel_available() -> bool:
    return torch.cuda.is_available() and mamba2.mamba_chunk_scan_combined is not None


@pytest.mark.skipif(not _kernel_available(),
                    reason="needs a CUDA GPU and the mamba_ssm package (its Triton SSD kernel)")
def test_triton_kernel_matches_torch_scan():
    torch.manual_seed(0)
    mixer = Mamba2Mixer(dataclasses.replace(TINY, mamba_chunk=64)).cuda()
    hidden = torch.randn(2, 200, TINY.hidden, device="cuda")

    def run(use_kernel):
        mixer.use_kernel = use_kernel
        mixer.zero_grad()
        x = hidden.clone().requires_grad_()
        out = mixer(x)
        out.square().mean().backward()
        return out, x.grad, {n: p.grad.clone() for n, p in mixer.named_parameters()}

    out_k, dx_k, grads_k = run(True)
    out_t, dx_t, grads_t = run(False)

    # The kernel's fp32 products may run in TF32 (10-bit mantissa): compare relative to
    # each tensor's scale at 1%.
    def close(a, b):
        return (a - b).abs().max() <= 1e-2 * b.abs().max() + 1e-6

    assert close(out_k, out_t) and close(dx_k, dx_t)
    for name in grads_t:
        assert close(grads_k[name], grads_t[name]), name
