"""The Mamba-2 mixer and its chunked SSD scan, in plain PyTorch.

Read top to bottom: the scan (`segsum`, `ssd_chunked`, and `ssd_sequential`, the
per-token recurrence the tests hold it to), the optional Triton kernel, then the
mixer. The facts behind each choice are in ../shared/reference/architectures.md
(Nemotron-H / Mamba-2 sections).

Notation: b batch, L sequence length, H heads, P head dim, G groups of B and C,
N state size, Q chunk length. Heads map to groups contiguously: head h reads group
h // (H / G), as in the Mamba-2 reference code.

The module knows nothing of parallelism, but is written so that tensor parallelism can
split it by heads and groups (as Megatron does) with plain contiguous shards, and so that
its parameters have one storage order in every layout (a checkpoint saved in any layout
loads in any other with no reordering):
- the forward takes every size from `n_heads` and `n_groups` (attributes a TP plan
  divides by the TP degree) and from the fixed `head_dim` and `state_size`, never from
  the spec;
- `in_proj`'s rows and `conv1d`'s channels are grouped by B/C group (`group_rows`):
  group g's z, x, B, C and dt rows, then group g+1's. A reference implementation
  concatenates z, x, B, C and dt of all heads instead; the two differ only by a fixed
  permutation of rows (the same model), but in this order the rows of a block of
  consecutive groups are one contiguous block, which is exactly what DTensor's Shard(0)
  gives a rank;
- parameters the forward uses directly (conv1d, dt_bias, A_log, D, norm_weight) are
  read through `_local`, so a plan may hold them as DTensors sharded along their first
  axis (torchtitan's MoE experts do the same); in_proj and out_proj are plain
  nn.Linear modules for the usual column- and row-wise styles;
- dt_bias, A_log and D live in their own submodule (`SSMCore`, attribute `ssm`), whose
  forward is the scan that reads them, so FSDP can keep them fp32 under a bf16
  mixed-precision policy by sharding that submodule as a unit of its own (its
  `keep_fp32` flag; see engine/parallel/fsdp.py);
- `shard_indices` says which rows, channels, heads and inner channels the r-th of T
  shards owns: each is one contiguous block, and the shard is again a complete, smaller
  mixer whose out_proj outputs sum to the full mixer's output.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import types

import torch
import torch.nn.functional as F
from torch import nn

from trainbench.catalog.models import ModelSpec
from trainbench.engine.models.transformer import INIT_STD

DT_MIN, DT_MAX = 1e-3, 1e-1
"""dt at init is sampled log-uniformly in [DT_MIN, DT_MAX] (Mamba-2)."""
DT_INIT_FLOOR = 1e-4
"""Smallest dt at init (Mamba-2 clamps the sample from below)."""
A_INIT_RANGE = (1.0, 16.0)
"""A = -exp(A_log) starts as minus a uniform sample of this range (Mamba-2)."""

def load_ssd_kernel():
    """The Triton chunk-scan kernel of the `mamba_ssm` package, or None (then the torch
    scan runs).

    The SSD kernels are Python and Triton, but the package's `__init__` imports its
    CUDA extension (`selective_scan_cuda`, unguarded in mamba-ssm 2.3.2's
    ops/selective_scan_interface.py), which a wheel built without it
    (MAMBA_SKIP_CUDA_BUILD=TRUE: the only way to carry mamba-ssm as a wheel, since PyPI
    has its source alone) lacks. Where that import fails, the package is entered without
    its `__init__`: a bare module with the package's path stands for it, so only the SSD
    modules and what they import load. Nothing else in trainbench imports mamba_ssm.
    """
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined as kernel
        return kernel
    except Exception:  # not installed, no CUDA extension, or a broken CUDA/Triton install
        pass
    try:
        spec = importlib.util.find_spec("mamba_ssm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    package = types.ModuleType("mamba_ssm")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["mamba_ssm"] = package
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined as kernel
        return kernel
    except Exception:  # no Triton (a CPU build of torch), or a kernel that fails to load
        for name in [m for m in sys.modules if m == "mamba_ssm" or m.startswith("mamba_ssm.")]:
            del sys.modules[name]
        return None


mamba_chunk_scan_combined = load_ssd_kernel()


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter: a DTensor's local shard, else the tensor itself.

    Duck-typed so this file needs no distributed import; differentiable, so gradients
    reach the sharded parameter.
    """
    to_local = getattr(param, "to_local", None)
    return to_local() if to_local is not None else param


# ------------------------------------------------------------------------ scan


def segsum(a: torch.Tensor) -> torch.Tensor:
    """[..., T] -> [..., T, T]: out[i, j] = a[j+1] + ... + a[i] for i >= j, -inf above.

    Built by a masked cumulative sum rather than as cumsum[i] - cumsum[j], which
    cancels catastrophically when the sums are large. Runs in fp32.
    """
    t = a.shape[-1]
    a = a.float()[..., None].expand(*a.shape, t)  # [..., i(source), j]: a[i] in column j
    strictly_below = torch.tril(torch.ones(t, t, dtype=torch.bool, device=a.device), -1)
    summed = torch.cumsum(a.masked_fill(~strictly_below, 0.0), dim=-2)
    on_or_below = torch.tril(torch.ones(t, t, dtype=torch.bool, device=a.device))
    return summed.masked_fill(~on_or_below, -math.inf)


def _split_heads(t: torch.Tensor, groups: int) -> torch.Tensor:
    """[..., H, X] -> [..., G, H/G, X], so a head's group is an axis, not a copy."""
    heads = t.shape[-2]
    if heads % groups:
        raise ValueError(f"{heads} heads do not split into {groups} groups")
    return t.unflatten(-2, (groups, heads // groups))


def _pad_to_chunks(x: torch.Tensor, dt_a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                   chunk: int) -> tuple[torch.Tensor, ...]:
    """x, dt_a, b and c padded along the sequence to a multiple of chunk. Padded steps have
    x = 0 and A = 0 (decay 1): they leave the state unchanged, so the final state is
    still the state after the last real token."""
    pad = (-x.shape[1]) % chunk
    if not pad:
        return x, dt_a, b, c
    return (F.pad(x, (0, 0, 0, 0, 0, pad)), F.pad(dt_a, (0, 0, 0, pad)),
            F.pad(b, (0, 0, 0, 0, 0, pad)), F.pad(c, (0, 0, 0, 0, 0, pad)))


def ssd_chunked(
    x: torch.Tensor,
    dt_a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    chunk: int,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The SSD scan in chunks of `chunk` tokens (Mamba-2 paper, "minimal" form).

    Computes y_t = C_t h_t with h_t = exp(A_t) h_{t-1} + B_t x_t^T, in four batched
    products instead of L sequential steps.

    Args:
        x: [b, L, H, P] inputs, already scaled by dt.
        dt_a: [b, L, H] log-decays A * dt (<= 0), already scaled by dt.
        b, c: [b, L, G, N] input and output projections of the state, per group; G must
            divide H and head h uses group h // (H / G). Pass G == H for per-head B, C.
            They are broadcast inside (as an axis of the products, never copied).
        chunk: chunk length Q; L need not be a multiple of it (padded inside).
        initial_state: [b, H, P, N] state before the first token, or None for zeros.

    Returns:
        y [b, L, H, P] in x's dtype, and the state after the last token [b, H, P, N]
        in fp32.

    Dtypes: cumulative sums, segsums and their exponentials run in fp32; the products
    run in x's dtype (the decays cast down to it), except the carry of states from
    chunk to chunk, which stays in fp32 across the whole sequence.
    """
    batch, length, heads, head_dim = x.shape
    groups, state = b.shape[-2], b.shape[-1]
    dtype = x.dtype
    x, dt_a, b, c = _pad_to_chunks(x, dt_a, b, c, chunk)
    n_chunks = x.shape[1] // chunk

    # Chunked views: x [b, c, l, g, r, p], B and C [b, c, l, g, n], with r = H/G.
    x = _split_heads(x.unflatten(1, (n_chunks, chunk)), groups)
    b = b.unflatten(1, (n_chunks, chunk))
    c = c.unflatten(1, (n_chunks, chunk))
    # Log-decays as [b, g, r, c, l] in fp32, so the cumsums run along the last axis.
    a = dt_a.float().unflatten(1, (n_chunks, chunk)).unflatten(-1, (groups, heads // groups))
    a = a.permute(0, 3, 4, 1, 2)
    a_cum = torch.cumsum(a, dim=-1)

    # 1. Inside each chunk: a causal, decay-weighted attention of C over B.
    decay_within = torch.exp(segsum(a)).to(dtype)  # [b, g, r, c, l, s]
    scores = torch.einsum("bclgn,bcsgn->bcgls", c, b)  # [b, c, g, l, s]
    weights = scores.unsqueeze(3) * decay_within.permute(0, 3, 1, 2, 4, 5)  # [b, c, g, r, l, s]
    y_diag = torch.einsum("bcgrls,bcsgrp->bclgrp", weights, x)

    # 2. The state each chunk leaves behind, from its own tokens only.
    decay_to_end = torch.exp(a_cum[..., -1:] - a_cum).to(dtype)  # [b, g, r, c, l]
    x_weighted = x * decay_to_end.permute(0, 3, 4, 1, 2).unsqueeze(-1)
    chunk_states = torch.einsum("bclgn,bclgrp->bcgrpn", b, x_weighted)

    # 3. Carry states across chunks (fp32): the state entering chunk k sums every earlier
    #    chunk's state, decayed by the chunk totals in between.
    if initial_state is None:
        initial_state = torch.zeros(
            batch, heads, head_dim, state, dtype=torch.float32, device=x.device)
    initial = _split_heads(initial_state.float().unsqueeze(1).flatten(3, 4), groups)
    initial = initial.unflatten(-1, (head_dim, state))  # [b, 1, g, r, p, n]
    states = torch.cat([initial, chunk_states.float()], dim=1)  # [b, c+1, g, r, p, n]
    chunk_totals = F.pad(a_cum[..., -1], (1, 0))  # [b, g, r, c+1]
    decay_across = torch.exp(segsum(chunk_totals))  # [b, g, r, c+1, c+1]
    carried = torch.einsum("bgrzk,bkgrpn->bzgrpn", decay_across, states)
    entering, final_state = carried[:, :-1], carried[:, -1]

    # 4. What the state entering each chunk contributes to every token in it.
    decay_from_start = torch.exp(a_cum).to(dtype)  # [b, g, r, c, l]
    y_off = torch.einsum("bclgn,bcgrpn->bclgrp", c, entering.to(dtype))
    y_off = y_off * decay_from_start.permute(0, 3, 4, 1, 2).unsqueeze(-1)

    # 5. Both parts, back to [b, L, H, P] without the padding.
    y = (y_diag + y_off).flatten(3, 4).flatten(1, 2)[:, :length]
    return y, final_state.flatten(1, 2)


def ssd_sequential(
    x: torch.Tensor,
    dt_a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same scan one token at a time: the reference `ssd_chunked` must match.

    h_t = exp(A_t) h_{t-1} + x_t B_t^T (state [b, H, P, N]), y_t = h_t C_t.
    Same arguments and results as `ssd_chunked`; runs in fp32. Slow (a Python loop over
    L): for tests only.
    """
    batch, length, heads, head_dim = x.shape
    groups = b.shape[-2]
    per_group = heads // groups
    # Per-head copies of B and C are fine here: clarity over memory.
    b = b.float().repeat_interleave(per_group, dim=2)
    c = c.float().repeat_interleave(per_group, dim=2)
    x, dt_a = x.float(), dt_a.float()
    h = (torch.zeros(batch, heads, head_dim, b.shape[-1], device=x.device)
         if initial_state is None else initial_state.float())
    ys = []
    for t in range(length):
        decay = torch.exp(dt_a[:, t])[..., None, None]  # [b, H, 1, 1]
        h = decay * h + x[:, t, :, :, None] * b[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", h, c[:, t]))
    return torch.stack(ys, dim=1), h


# ----------------------------------------------------------------------- mixer


class SSMCore(nn.Module):
    """The scan and the per-head parameters it reads: dt_bias, A_log, D (fp32).

    x [b, L, H, P], raw dt [b, L, H], B and C [b, L, G, N] -> y + D*x [b, L, H, P].
    dt = softplus(dt + dt_bias), A = -exp(A_log): both in fp32, as is the D skip's
    product; y comes back in x's dtype.

    A module of its own so that these parameters can stay fp32 when the rest of the
    model computes in bf16: FSDP2 casts every parameter of a sharding unit to the
    unit's compute dtype when it gathers them, so `apply_fsdp` makes each module whose
    `keep_fp32` is True a unit with an fp32 policy. exp(A_log) spans [1, 16] and sets
    every decay, and dt_bias sits inside a softplus near 1e-3: bf16's 3 significant
    digits would show in both.
    """

    keep_fp32 = True

    def __init__(self, n_heads: int):
        super().__init__()
        self.dt_bias = nn.Parameter(torch.empty(n_heads, dtype=torch.float32))
        self.A_log = nn.Parameter(torch.empty(n_heads, dtype=torch.float32))
        self.D = nn.Parameter(torch.empty(n_heads, dtype=torch.float32))

    def forward(self, x: torch.Tensor, dt: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
                chunk: int, use_kernel: bool = True) -> torch.Tensor:
        A = -torch.exp(_local(self.A_log).float())
        dt_bias, D = _local(self.dt_bias).float(), _local(self.D).float()
        if use_kernel and x.is_cuda and mamba_chunk_scan_combined is not None:
            # The kernel applies softplus(dt + dt_bias) and the D skip itself.
            return mamba_chunk_scan_combined(
                x, dt, A, b, c, chunk, D=D, dt_bias=dt_bias, dt_softplus=True)
        dt = F.softplus(dt.float() + dt_bias)  # [b, L, H], fp32
        y, _ = ssd_chunked(x * dt.unsqueeze(-1).to(x.dtype), A * dt, b, c, chunk)
        return y + (x.float() * D.unsqueeze(-1)).to(y.dtype)


class Mamba2Mixer(nn.Module):
    """Mamba-2 mixer: [b, L, hidden] -> [b, L, hidden].

    in_proj -> (z, xBC, dt); xBC -> causal depthwise conv -> silu -> (x, B, C);
    dt = softplus(dt + dt_bias); y = SSD(x*dt, A*dt, B, C) + D*x;
    y = rmsnorm over groups of d_inner/G of (y * silu(z)), times weight; out_proj(y).

    Row layout (what every parallel layout shares; see the module docstring):
    - `in_proj.weight` rows: G blocks, one per B/C group g, each holding in order z and x
      of the group's H/G heads (head-major: (H/G)*P rows each), B_g (N rows), C_g
      (N rows) and dt of its heads (H/G rows). `group_rows()` lists one block.
    - `conv1d` channels: G blocks of x, B_g, C_g, the same rows of in_proj in the same
      order.
    - `ssm.dt_bias`, `ssm.A_log`, `ssm.D` have one entry per head; `norm_weight` and
      out_proj's input columns follow d_inner's head-major order, and the norm's groups
      of d_inner/G channels are exactly the channels of the heads of one B/C group.
    Because head h belongs to group h // (H/G), a contiguous block of G/T groups and
    their heads form a self-contained piece of the mixer, and in this layout its rows
    of every parameter are one contiguous block: `shard_indices(r, T)` gives them. No
    communication is needed inside the mixer; only out_proj's output is a partial sum
    over shards.

    ssm.dt_bias, ssm.A_log and ssm.D take no weight decay: each carries
    `_no_weight_decay = True` (set again by init_weights, since to_empty and FSDP
    replace parameter objects), and `no_weight_decay_names` lists them by name for
    optimizer builders that work on names.
    """

    no_weight_decay_names = ("ssm.dt_bias", "ssm.A_log", "ssm.D")

    def __init__(self, spec: ModelSpec):
        super().__init__()
        if spec.mamba_heads % spec.mamba_groups:
            raise ValueError(
                f"{spec.mamba_heads} Mamba heads do not split into {spec.mamba_groups} groups")
        # Sizes the forward reads. n_heads and n_groups are what a tensor-parallel plan
        # divides; head_dim and state_size never change.
        self.n_heads = spec.mamba_heads
        self.n_groups = spec.mamba_groups
        self.head_dim = spec.mamba_head_dim
        self.state_size = spec.mamba_state
        self.chunk = spec.mamba_chunk
        self.eps = spec.norm_eps
        self.use_kernel = True
        """Use the mamba_ssm Triton scan on CUDA when it is installed (False: torch scan)."""

        d_inner = self.n_heads * self.head_dim
        bc = self.n_groups * self.state_size
        conv_channels = d_inner + 2 * bc
        self.in_proj = nn.Linear(spec.hidden, 2 * d_inner + 2 * bc + self.n_heads, bias=False)
        self.conv1d = nn.Conv1d(
            conv_channels, conv_channels, spec.mamba_conv_kernel, groups=conv_channels,
            padding=spec.mamba_conv_kernel - 1, bias=True)
        self.ssm = SSMCore(self.n_heads)
        self.norm_weight = nn.Parameter(torch.empty(d_inner))
        self.out_proj = nn.Linear(d_inner, spec.hidden, bias=False)
        self._mark_no_weight_decay()
        self.init_weights(INIT_STD)

    # -- layout ---------------------------------------------------------------

    def group_rows(self) -> list[tuple[str, int]]:
        """(name, rows) of one group's block of in_proj's output, in order."""
        heads = self.n_heads // self.n_groups
        inner = heads * self.head_dim
        return [("z", inner), ("x", inner), ("B", self.state_size), ("C", self.state_size),
                ("dt", heads)]

    # -- parameters -----------------------------------------------------------

    def _mark_no_weight_decay(self) -> None:
        for name in self.no_weight_decay_names:
            self.get_parameter(name)._no_weight_decay = True

    @torch.no_grad()
    def init_weights(self, out_std: float) -> None:
        """(Re)initialise every parameter in place, as Mamba-2 does.

        Works on real tensors after `to_empty(device=...)` (a no-op on meta tensors).
        `out_std` is out_proj's standard deviation (the model scales it with depth).
        """
        nn.init.normal_(self.in_proj.weight, std=INIT_STD)
        self.conv1d.reset_parameters()  # PyTorch's default (Kaiming uniform), as Mamba-2
        ssm = self.ssm
        # dt_bias = softplus^-1(dt) for dt log-uniform in [DT_MIN, DT_MAX], so that
        # softplus(0 + dt_bias) starts at that dt.
        log_dt = torch.empty_like(ssm.dt_bias, dtype=torch.float32).uniform_(
            math.log(DT_MIN), math.log(DT_MAX))
        dt = torch.exp(log_dt).clamp(min=DT_INIT_FLOOR)
        ssm.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        ssm.A_log.copy_(torch.log(torch.empty_like(ssm.A_log).uniform_(*A_INIT_RANGE)))
        nn.init.ones_(ssm.D)
        nn.init.ones_(self.norm_weight)
        nn.init.normal_(self.out_proj.weight, std=out_std)
        self._mark_no_weight_decay()

    # -- forward --------------------------------------------------------------

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [b, L, hidden] -> [b, L, hidden]."""
        rows = dict(self.group_rows())
        # [b, L, G, rows of one group]: the sections are split within each group.
        zxbcdt = self.in_proj(hidden).unflatten(-1, (self.n_groups, -1))
        z, xbc, dt = torch.split(
            zxbcdt, [rows["z"], rows["x"] + rows["B"] + rows["C"], rows["dt"]], dim=-1)
        return self.out_proj(self.mix(xbc, dt, z))

    def mix(self, xbc: torch.Tensor, dt: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Causal conv, SSD scan and gated norm: in_proj's xBC, dt and z sections (each
        [b, L, G, rows of one group]) -> y [b, L, d_inner], out_proj's input."""
        batch, length = xbc.shape[:2]
        rows = dict(self.group_rows())
        xbc = F.silu(self._causal_conv(xbc.flatten(2))).unflatten(-1, (self.n_groups, -1))
        x, b, c = torch.split(xbc, [rows["x"], rows["B"], rows["C"]], dim=-1)
        # Group-major heads are head-major: head h is head h % (H/G) of group h // (H/G).
        x = x.reshape(batch, length, self.n_heads, self.head_dim)

        y = self.ssm(x, dt.flatten(2), b, c, self.chunk, self.use_kernel)
        return self._gated_norm(y.flatten(2), z.flatten(2))

    def _causal_conv(self, xbc: torch.Tensor) -> torch.Tensor:
        """Depthwise conv along L; padding k-1 on both sides, first L outputs kept, so
        output t sees inputs t-k+1..t only."""
        length, channels = xbc.shape[1], xbc.shape[2]
        out = F.conv1d(
            xbc.transpose(1, 2), _local(self.conv1d.weight), _local(self.conv1d.bias),
            padding=self.conv1d.padding, groups=channels)  # channels: local under TP
        return out[..., :length].transpose(1, 2)

    def _gated_norm(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """rmsnorm(y * silu(z)) over groups of d_inner/G channels, times weight (fp32)."""
        gated = (y.float() * F.silu(z.float())).unflatten(-1, (self.n_groups, -1))
        normed = gated * torch.rsqrt(gated.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed.flatten(-2) * _local(self.norm_weight).float()).to(y.dtype)


def shard_indices(
    n_heads: int, n_groups: int, head_dim: int, state_size: int, rank: int, world: int
) -> dict[str, torch.Tensor]:
    """Which entries of a full mixer's tensors the `rank`-th of `world` shards owns.

    Shard r owns the groups r*G/T .. (r+1)*G/T - 1 and their heads (T must divide G).
    In the mixer's group-major layout each of its index sets is one contiguous block,
    the r-th of T equal blocks, which is what a plain Shard(0) gives rank r. Returns
    int64 index tensors into the full sizes:
    - 'in_proj': rows of in_proj.weight;
    - 'conv': channels of conv1d.weight and conv1d.bias;
    - 'heads': entries of ssm.dt_bias, ssm.A_log and ssm.D;
    - 'inner': entries of norm_weight and columns of out_proj.weight.
    A mixer built with n_heads/T heads and n_groups/T groups holding these slices is
    shard r; the shards' outputs sum to the full mixer's output.
    """
    if n_groups % world or n_heads % n_groups:
        raise ValueError(
            f"cannot split {n_heads} heads in {n_groups} groups over {world} shards: "
            "the shard count must divide the group count")
    d_inner, bc = n_heads * head_dim, n_groups * state_size

    def block(total: int) -> torch.Tensor:
        size = total // world
        return torch.arange(rank * size, (rank + 1) * size)

    return {
        "in_proj": block(2 * d_inner + 2 * bc + n_heads),
        "conv": block(d_inner + 2 * bc),
        "heads": block(n_heads),
        "inner": block(d_inner),
    }


def choose_scan(model: nn.Module, choice: str, device_type: str) -> str | None:
    """Set which scan the model's Mamba-2 mixers run ('kernel', 'torch' or 'auto', the
    plan's ssd_scan) and say which runs, for run.json; None for a model without them.
    RuntimeError where the kernel is asked for on CUDA and mamba_ssm does not import."""
    mixers = [m for m in model.modules() if isinstance(m, Mamba2Mixer)]
    if not mixers:
        return None
    available = device_type == "cuda" and mamba_chunk_scan_combined is not None
    if choice == "kernel" and not available:
        raise RuntimeError("ssd_scan=kernel: mamba_ssm's Triton SSD kernels do not import "
                           "here; bring mamba_ssm (docs/gpu-acceptance.md) or --set ssd_scan=torch")
    use_kernel = choice != "torch"
    for mixer in mixers:
        mixer.use_kernel = use_kernel
    if use_kernel and available:
        return "mamba_ssm Triton SSD kernels"
    return "torch chunked scan" + ("" if choice == "torch" or device_type != "cuda"
                                   else " (mamba_ssm does not import here)")
