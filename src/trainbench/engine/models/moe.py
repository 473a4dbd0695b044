"""Mixture-of-experts MLP: router, routed experts as grouped weights, shared expert.

Read top to bottom: the two routers (Qwen3's softmax top-k, DeepSeek-V3's sigmoid
top-k with group-limited selection and the auxiliary-loss-free bias), the two balance
losses, the dropless grouped expert computation, and the `MoE` module that ties them.

Dropless: every token goes to exactly `top_k` routed experts, whatever the load; no
capacity factor, no token is ever dropped. Token-to-expert assignments are sorted by
expert so that each expert multiplies one contiguous block of rows: with
`torch._grouped_mm` on a CUDA GPU that has it, one grouped GEMM per projection, in the
compute dtype whatever the master weights' dtype, with no host read; on any other
device a loop over the experts (the same arithmetic, expert by expert, O(E f h) in
backward). torchao's FP8/MXFP8 experts take the grouped GEMM with their token groups
padded here, on the device (`expert_path`, `pad_token_groups`; docs/moe.md).

Nothing in here knows of parallelism: expert parallelism replaces `compute_experts`
from engine/parallel/ep.py. The balance loss is not returned through `forward` (which keeps the common
block signature): each MoE layer adds its gradient in backward (Megatron-LM's
"aux loss auto scaler" pattern), so the trainer's loss code is the same for every model,
and keeps the value in `last_aux_loss` for whoever wants to log it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainbench.catalog.models import ModelSpec
from trainbench.engine.models.transformer import MLP

from .moe_rows import combine_rows, scatter_rows

INIT_STD = 0.02


# ----------------------------------------------------------------------- routers


def softmax_topk(logits: torch.Tensor, k: int, renormalize: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Qwen3 (and Mixtral) routing of logits [T, E]: softmax over all experts, keep the k
    largest probabilities; with `renormalize` (Qwen3's norm_topk_prob) they sum to 1.

    Returns (weights [T, k] fp32, expert ids [T, k], probabilities [T, E] fp32).
    """
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids, probs


def sigmoid_topk(logits: torch.Tensor, k: int, bias: torch.Tensor, n_group: int,
                 topk_group: int, renormalize: bool, scaling: float
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 routing of logits [T, E] (technical report, sec. 2.1.2 and 2.1.3).

    Affinities s = sigmoid(logits). The per-expert `bias` (auxiliary-loss-free load
    balancing) is added for the choice only: experts are first restricted to the
    `topk_group` best of `n_group` equal groups, a group scored by the sum of its two
    best biased affinities, then the k best biased affinities win. The gate weights
    are the chosen experts' unbiased affinities, normalised to sum to 1 (norm_topk_prob)
    and multiplied by `scaling` (routed_scaling_factor).

    Returns (weights [T, k] fp32, expert ids [T, k], affinities s [T, E] fp32).
    """
    scores = torch.sigmoid(logits.float())
    choice = scores + bias.float()
    T, E = choice.shape
    if n_group > 1:
        grouped = choice.view(T, n_group, E // n_group)
        group_score = grouped.topk(min(2, E // n_group), dim=-1).values.sum(dim=-1)
        keep_groups = group_score.topk(topk_group, dim=-1).indices
        group_mask = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, keep_groups, True)
        expert_mask = group_mask.unsqueeze(-1).expand(T, n_group, E // n_group).reshape(T, E)
        choice = choice.masked_fill(~expert_mask, float("-inf"))
    ids = choice.topk(k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scaling, ids, scores


# --------------------------------------------------------------- balance losses


def expert_counts(ids: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Assignments per expert (int64 [n_experts]) of expert ids of any shape. A scatter-add,
    not torch.bincount: CUDA's bincount reads the largest id on the host to size its
    output, a sync in the middle of every MoE layer."""
    flat = ids.flatten()
    return torch.zeros(n_experts, dtype=torch.int64, device=ids.device).scatter_add_(
        0, flat, torch.ones_like(flat))


def switch_balance_loss(probs: torch.Tensor, ids: torch.Tensor, n_experts: int,
                        counts_of=None) -> torch.Tensor:
    """E * sum_i f_i * P_i over all T tokens (Switch Transformer, Fedus et al. 2021, eq. 4;
    Hugging Face Qwen3-MoE's load_balancing_loss_func): f_i the share of the T*k
    assignments that went to expert i, P_i the mean router probability of expert i.
    Equals 1 for a perfectly uniform router; its gradient flows through P only.

    `counts_of` maps the assignment counts to those of the whole sequences (MoE's
    `sequence_counts`); P stays the mean over the tokens given."""
    counts = expert_counts(ids, n_experts).float()
    if counts_of is not None:
        counts = counts_of(counts)
    f = counts / counts.sum()
    p = probs.mean(dim=0)
    return n_experts * (f * p).sum()


def sequence_balance_loss(scores: torch.Tensor, ids: torch.Tensor, n_experts: int,
                          batch: int, counts_of=None) -> torch.Tensor:
    """DeepSeek-V3's complementary sequence-wise balance loss (report eq. 17-20), without
    its alpha: for each sequence, sum_i f_i * P_i with f_i = E/(k*T) * (tokens of the
    sequence routed to i) and P_i the mean over the sequence's T tokens of the affinity
    normalised over all experts, s_i / sum_j s_j; averaged over the sequences.
    `counts_of` as for switch_balance_loss (per sequence here)."""
    k = ids.shape[-1]
    ids = ids.view(batch, -1, k)
    T = ids.shape[1]
    counts = torch.zeros(batch, n_experts, device=ids.device).scatter_add_(
        1, ids.reshape(batch, -1), torch.ones(batch, T * k, device=ids.device))
    if counts_of is not None:
        counts = counts_of(counts)
    f = counts * n_experts / counts.sum(dim=-1, keepdim=True)  # sum = k * tokens
    normed = scores / scores.sum(dim=-1, keepdim=True)
    p = normed.view(batch, T, n_experts).mean(dim=1)
    return (f * p).sum(dim=-1).mean()


class _AddAuxLossGrad(torch.autograd.Function):
    """Identity on `out` whose backward also sends a gradient of `scale` into `aux`, as
    if `aux` times `scale` had been added to the final loss (Megatron-LM's
    MoEAuxLossAutoScaler and its loss scale)."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(aux)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, ctx.scale), None


# ---------------------------------------------------------------- expert compute

GROUPED_MM_CAPABILITY = (9, 0)
"""torch._grouped_mm has its own CUDA kernels from Hopper (sm_90) on; on older GPUs (and
on a CPU) it loops over the groups on the host, after copying the offsets there."""
GROUP_ALIGNMENT = {"Float8TrainingWeightWrapperTensor": 16,
                   "MXFP8TrainingWeightWrapperTensor": 32}
"""Rows per expert group that torchao's low-precision grouped GEMMs need, by the wrapper
type of the weights (engine/parallel/float8.py wrap_experts): FP8 rowwise's
torch._scaled_grouped_mm wants each group's rows a multiple of 16 (they are the
contraction dimension of the weight gradient); MXFP8 scales blocks of 32 along it."""


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the expert GEMMs run in: autocast's where autocast is on for x's device
    (a one-rank bf16 run: fp32 master weights and activations), else x's own."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


def expert_path(device_type: str, dtype: torch.dtype, *, grouped_mm_kernel: bool,
                capability: tuple[int, int] | None, low_precision: bool) -> str:
    """Which expert computation runs, as a pure function of the facts it depends on:
    'grouped' (one torch._grouped_mm per projection, no host read) or 'loop' (expert by
    expert; the row counts are read on the host once per layer).

    `dtype` is the compute dtype (compute_dtype: autocast's, whatever the master weights'
    dtype), `grouped_mm_kernel` whether this torch has torch._grouped_mm, `capability`
    the CUDA device's (None elsewhere). torchao's low-precision wrappers always take the
    grouped GEMM (their MXFP8 emulation runs on any device)."""
    if low_precision:
        return "grouped"
    if (device_type == "cuda" and grouped_mm_kernel and capability is not None
            and tuple(capability) >= GROUPED_MM_CAPABILITY and dtype == torch.bfloat16):
        return "grouped"
    return "loop"


def _expert_path_for(x: torch.Tensor, w: torch.Tensor) -> str:
    return expert_path(x.device.type, compute_dtype(x),
                       grouped_mm_kernel=hasattr(torch, "_grouped_mm"),
                       capability=(torch.cuda.get_device_capability(x.device) if x.is_cuda
                                   else None),
                       low_precision=_low_precision(w))


def _low_precision(w: torch.Tensor) -> bool:
    """A weight that torchao's FP8 or MXFP8 training wraps (engine/parallel/float8.py
    wrap_experts): its grouped GEMM quantises both operands (MXFP8 on any device,
    emulated off Blackwell; FP8 on CUDA only)."""
    return type(w).__name__ in GROUP_ALIGNMENT


def pad_token_groups(counts: torch.Tensor, alignment: int, rows: int
                     ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Where each of `rows` rows sorted by expert (counts [E]) goes when every expert's
    group is padded up to a multiple of `alignment` rows: (destination row of each row
    [rows] int64, the padded groups' end offsets [E] int32, the padded row count).

    No host read: the padded row count is the static bound round_up(rows +
    min(E, rows) * (alignment - 1), alignment), so the shapes never depend on the
    routing; rows past the last group's end belong to no group (the grouped GEMMs
    neither read them nor write them: their values stay undefined and are never read
    back), and a padding row inside a group is zero."""
    E = counts.numel()
    counts = counts.to(torch.int64)
    padded = (counts + alignment - 1) // alignment * alignment
    ends, padded_ends = torch.cumsum(counts, 0), torch.cumsum(padded, 0)
    row = torch.arange(rows, device=counts.device)
    expert = torch.searchsorted(ends, row, right=True)  # expert of each sorted row
    dest = row + (padded_ends - padded - ends + counts)[expert]  # + padded start - start
    bound = rows + min(E, rows) * (alignment - 1)
    return dest, padded_ends.to(torch.int32), -(-bound // alignment) * alignment


def swiglu(gate: torch.Tensor, up: torch.Tensor,
           weight: torch.Tensor | None = None) -> torch.Tensor:
    """The experts' activation, silu(gate) * up, times each row's gate weight [rows, 1]
    where one is given: MoE.activate, which parallel.keep_only_inputs_of_cheap_ops makes
    keep only its inputs for the backward, as it does the dense MLP's.

    The gate weight is applied here, before the down projection, not to the expert's
    output: the down projection is linear, so the output is the same, and the weight's
    gradient then reads the activation (rerun from gate and up) instead of a kept
    [rows, hidden] expert output. Megatron-Core does the same (TEGroupedMLP's
    weighted_bias_swiglu_impl on the permuted probs; its token dispatcher unpermutes
    without them)."""
    out = F.silu(gate) * up
    return out if weight is None else out * weight


def _grouped_swiglu(x: torch.Tensor, offs: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                    w2: torch.Tensor, activate=swiglu,
                    weights: torch.Tensor | None = None) -> torch.Tensor:
    """One torch._grouped_mm per projection over rows grouped by `offs` (group ends).
    The weights are passed transposed, [E, in, out] column-major, as the FP8 forms want."""
    def mm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
    return mm(activate(mm(x, w1), mm(x, w3), weights), w2)


def _loop_swiglu(x: torch.Tensor, counts: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                 w2: torch.Tensor, activate=swiglu,
                 weights: torch.Tensor | None = None) -> torch.Tensor:
    """Expert by expert, for devices without a grouped GEMM. Each weight is split into its
    experts once (`unbind`): its backward stacks the E expert gradients once, O(E f h).
    Indexing the parameter inside the loop (`w1[e]`) would cost a whole [E, f, h] zero
    gradient per expert in backward, O(E^2 f h) per layer."""
    # One host read of the counts per layer: the loop needs the split sizes.
    sizes = counts.tolist()
    experts = zip(w1.unbind(0), w3.unbind(0), w2.unbind(0))
    row_weights = weights.split(sizes) if weights is not None else [None] * len(sizes)
    outs = [activate(rows @ g.T, rows @ u.T, weight) @ d.T
            for rows, weight, (g, u, d) in zip(x.split(sizes), row_weights, experts)
            if rows.shape[0]]
    return torch.cat(outs) if outs else x.new_zeros(0, w2.shape[1])


def grouped_swiglu(x: torch.Tensor, counts: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                   w2: torch.Tensor, grouped_mm: bool | None = None,
                   activate=swiglu, weights: torch.Tensor | None = None) -> torch.Tensor:
    """SwiGLU of rows x [N, d] sorted by expert, expert e taking the next counts[e] rows:
    (silu(x W1_e^T) * x W3_e^T) W2_e^T with W1, W3 [E, f, d] and W2 [E, d, f], each
    expert's weight [out, in] as an nn.Linear's (and Hugging Face's) is.

    The GEMMs run in the compute dtype (compute_dtype): x and each weight are cast to it
    once per call, as autocast would cast them per GEMM, and autocast is off inside (the
    casts are done). torchao's FP8/MXFP8 wrappers quantise on their own; their token
    groups are padded here to the multiple their GEMMs need (GROUP_ALIGNMENT), without a
    host read, and the padding rows dropped from the output.

    `grouped_mm` forces one path (tests compare them); None picks by expert_path.
    `activate(gate, up, weight)` is the activation (an MoE layer passes its own,
    MoE.activate); `weights` [N, 1], each row's gate weight, is handed to it (None: none)."""
    if x.shape[0] == 0:
        return x.new_zeros(0, w2.shape[1])
    low = _low_precision(w1)
    if grouped_mm is None:
        grouped_mm = _expert_path_for(x, w1) == "grouped"
    dtype = compute_dtype(x)
    x = x.to(dtype)
    if weights is not None:
        weights = weights.to(dtype)
    if not low:
        w1, w3, w2 = (w.to(dtype) for w in (w1, w3, w2))
    with torch.autocast(x.device.type, enabled=False):
        if not grouped_mm:
            return _loop_swiglu(x, counts, w1, w3, w2, activate, weights)
        alignment = GROUP_ALIGNMENT.get(type(w1).__name__)
        if alignment is None:
            return _grouped_swiglu(x, torch.cumsum(counts, 0, dtype=torch.int32), w1, w3, w2,
                                   activate, weights)
        dest, offs, rows = pad_token_groups(counts, alignment, x.shape[0])
        padded = scatter_rows(x, dest, rows)
        if weights is not None:
            weights = scatter_rows(weights, dest, rows)
        return _grouped_swiglu(padded, offs, w1, w3, w2, activate,
                               weights).index_select(0, dest)


# ------------------------------------------------------------------------ module


class MoE(nn.Module):
    """Router + `n_routed_experts` SwiGLU experts (top_k per token) + optional shared
    SwiGLU expert that every token passes through; x [b, s, hidden] -> [b, s, hidden]."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        h, f, E = spec.hidden, spec.moe_ffn, spec.n_routed_experts
        if spec.top_k < 1 or spec.top_k > E:
            raise ValueError(f"{spec.name}: top_k {spec.top_k} must be between 1 and the "
                             f"{E} routed experts")
        if spec.router not in ("softmax", "sigmoid"):
            raise ValueError(f"unknown router {spec.router!r}; expected 'softmax' or 'sigmoid'")
        if E % spec.n_group or spec.topk_group > spec.n_group:
            raise ValueError(f"{spec.name}: {E} experts do not split into n_group "
                             f"{spec.n_group} groups of which topk_group {spec.topk_group} win")
        self.spec = spec
        self.n_experts, self.top_k = E, spec.top_k
        self.router = nn.Linear(h, E, bias=False)
        # Grouped expert weights: one tensor per projection, experts on dim 0, so FSDP
        # and expert parallelism shard whole experts; each expert's [out, in].
        self.w1 = nn.Parameter(torch.empty(E, f, h))  # gate
        self.w3 = nn.Parameter(torch.empty(E, f, h))  # up
        self.w2 = nn.Parameter(torch.empty(E, h, f))  # down
        self.shared = (MLP(h, f * spec.n_shared_experts, "swiglu")
                       if spec.n_shared_experts else None)
        # Auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias, used only to
        # choose experts, nudged towards balance by the observed load, never by gradients.
        self.register_buffer("expert_bias", torch.zeros(E), persistent=True)
        self.register_buffer("expert_load", torch.zeros(E), persistent=False)
        self.last_aux_loss: torch.Tensor | None = None
        # The factor the trainer scales each microbatch's loss by (1 / microbatches per
        # rank): the balance loss must count as much per microbatch as the loss does, or
        # one process (more microbatches) weighs it more than a data-parallel layout.
        self.aux_grad_scale = 1.0

    def init_weights(self, out_std: float) -> None:
        nn.init.normal_(self.router.weight, std=INIT_STD)
        nn.init.normal_(self.w1, std=INIT_STD)
        nn.init.normal_(self.w3, std=INIT_STD)
        nn.init.normal_(self.w2, std=out_std)
        if self.shared is not None:
            self.shared.init_weights(out_std)
        self.expert_bias.zero_()
        self.expert_load.zero_()

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(weights [T, k], ids [T, k], scores [T, E]) for tokens x [T, hidden]."""
        logits = self.router(x)
        s = self.spec
        if s.router == "softmax":
            return softmax_topk(logits, self.top_k, s.norm_topk_prob)
        return sigmoid_topk(logits, self.top_k, self.expert_bias, s.n_group, s.topk_group,
                            s.norm_topk_prob, s.routed_scaling)

    @torch.no_grad()
    def update_bias(self) -> None:
        """b_i += gamma * sign(mean load - load_i) from the load seen since the last update,
        then forget that load. Called once per training step, after the optimizer step
        (DeepSeek-V3 report sec. 2.1.2: "at the end of each step"; `update_expert_biases`):
        the step's every microbatch routes with one bias, so any split of the step's
        batch over microbatches and ranks moves the bias alike, a recomputed block routes
        as its first forward did, and no load is left over at a checkpoint."""
        gamma = self.spec.bias_update_speed
        # No load seen (a step without a training forward) moves nothing: sign(0) = 0.
        # Testing the load's sum instead would read it on the host in the middle of a step.
        if gamma:
            self.expert_bias += gamma * torch.sign(self.expert_load.mean() - self.expert_load)
        self.expert_load.zero_()

    def sequence_counts(self, counts: torch.Tensor) -> torch.Tensor:
        """Per-expert assignment counts over whole sequences, from this forward's tokens'
        counts (float, no gradient): the balance losses' f. The identity here; context
        parallelism, whose ranks hold parts of each sequence, replaces it with the sum
        over its ranks (engine/parallel/cp.py). Each rank's loss then takes the global f
        with its own tokens' P, and the mean of the ranks' gradients is the gradient of
        the whole sequence's loss."""
        return counts

    def compute_experts(self, rows: torch.Tensor, counts: torch.Tensor,
                        weights: torch.Tensor | None = None) -> torch.Tensor:
        """Routed experts on rows sorted by expert (counts [E]), each row's output scaled
        by its gate weight (weights [rows, 1]); the hook that expert parallelism
        (engine/parallel/ep.py) replaces with its dispatch and combine."""
        return grouped_swiglu(rows, counts, self.w1, self.w3, self.w2,
                              activate=self.activate, weights=weights)

    activate = staticmethod(swiglu)
    """The experts' activation; parallel.keep_only_inputs_of_cheap_ops wraps it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_meta:
            # A shape-only pass: pipeline stages of older torch releases (before the 2.13
            # here) infer their output shapes by running the stage on the meta device.
            # Routing needs the token values (topk picks by them); the output
            # has x's shape.
            return torch.empty_like(x)
        b, s, h = x.shape
        tokens = x.reshape(-1, h)
        weights, ids, scores = self.route(tokens)
        k = self.top_k
        flat_ids = ids.flatten()
        counts = expert_counts(flat_ids, self.n_experts)
        if self.training and torch.is_grad_enabled() and self.spec.bias_update_speed:
            self.expert_load += counts.to(self.expert_load.dtype)
        # Sort the T*k (token, slot) pairs by expert: each expert's rows become contiguous.
        order = torch.argsort(flat_ids, stable=True)
        token_of = order // k
        # Rows in the experts' compute dtype before the gather (and EP's all-to-all):
        # under autocast a cast of the T tokens, not of the T*k rows.
        dtype = compute_dtype(tokens)
        rows = tokens.to(dtype)[token_of]
        gate = weights.flatten()[order].unsqueeze(-1).to(dtype)
        out = combine_rows(self.compute_experts(rows, counts, gate), token_of, tokens.shape[0])
        if self.shared is not None:
            out = out + self.shared(tokens)
        out = out.to(x.dtype).view(b, s, h)
        aux = self.balance_loss(scores, ids, b)
        self.last_aux_loss = aux.detach() if aux is not None else None
        if aux is not None and self.training and torch.is_grad_enabled():
            out = _AddAuxLossGrad.apply(out, aux, self.aux_grad_scale)
        return out

    def balance_loss(self, scores: torch.Tensor, ids: torch.Tensor,
                     batch: int) -> torch.Tensor | None:
        """The configured balance loss times its coefficient, or None when it is off."""
        s = self.spec
        if not s.aux_loss_coef or s.aux_loss == "none":
            return None
        if s.aux_loss == "sequence":
            return s.aux_loss_coef * sequence_balance_loss(scores, ids, self.n_experts, batch,
                                                           self.sequence_counts)
        return s.aux_loss_coef * switch_balance_loss(scores, ids, self.n_experts,
                                                     self.sequence_counts)


def moe_layers(model: nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def update_expert_biases(layers: list[MoE]) -> None:
    """The end-of-step bias update of every MoE layer given (a no-op without a bias)."""
    for moe in layers:
        moe.update_bias()


def total_aux_loss(model: nn.Module) -> torch.Tensor | None:
    """Sum of the last forward's balance losses over the MoE layers (already scaled by
    their coefficient), for logging; None if no layer computed one."""
    losses = [m.last_aux_loss for m in moe_layers(model) if m.last_aux_loss is not None]
    return torch.stack(losses).sum() if losses else None
