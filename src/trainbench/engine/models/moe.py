"""Mixture-of-experts MLP: router, routed experts as grouped weights, shared expert.

Read top to bottom: the two routers (Qwen3's softmax top-k, DeepSeek-V3's sigmoid
top-k with group-limited selection and the auxiliary-loss-free bias), the two balance
losses, the dropless grouped expert computation, and the `MoE` module that ties them.

Dropless: every token goes to exactly `top_k` routed experts, whatever the load; no
capacity factor, no token is ever dropped. Token-to-expert assignments are sorted by
expert so that each expert multiplies one contiguous block of rows: with
`torch._grouped_mm` on a CUDA GPU that has it, one grouped GEMM per projection; on any
other device a loop over the experts (the same arithmetic, expert by expert).

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


def switch_balance_loss(probs: torch.Tensor, ids: torch.Tensor, n_experts: int,
                        counts_of=None) -> torch.Tensor:
    """E * sum_i f_i * P_i over all T tokens (Switch Transformer, Fedus et al. 2021, eq. 4;
    Hugging Face Qwen3-MoE's load_balancing_loss_func): f_i the share of the T*k
    assignments that went to expert i, P_i the mean router probability of expert i.
    Equals 1 for a perfectly uniform router; its gradient flows through P only.

    `counts_of` maps the assignment counts to those of the whole sequences (MoE's
    `sequence_counts`); P stays the mean over the tokens given."""
    counts = torch.bincount(ids.flatten(), minlength=n_experts).float()
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


def _grouped_mm_available(x: torch.Tensor) -> bool:
    # torch._grouped_mm runs on CUDA GPUs with bf16; its CPU path (where present) wants
    # 16-byte aligned strides that tiny shapes do not have, so the loop serves elsewhere.
    return (x.is_cuda and x.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")
            and torch.cuda.get_device_capability(x.device) >= (9, 0))


def _low_precision(w: torch.Tensor) -> bool:
    """A weight that torchao's FP8 or MXFP8 training wraps (engine/parallel/float8.py
    wrap_experts): its grouped GEMM quantises both operands (MXFP8 on any device,
    emulated off Blackwell; FP8 on CUDA only)."""
    return type(w).__name__.endswith("TrainingWeightWrapperTensor")


def grouped_swiglu(x: torch.Tensor, counts: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                   w2: torch.Tensor, grouped_mm: bool | None = None) -> torch.Tensor:
    """SwiGLU of rows x [N, d] sorted by expert, expert e taking the next counts[e] rows:
    (silu(x W1_e^T) * x W3_e^T) W2_e^T with W1, W3 [E, f, d] and W2 [E, d, f], each
    expert's weight [out, in] as an nn.Linear's (and Hugging Face's) is. Passed to
    torch._grouped_mm transposed, the weights are column-major, as its FP8 forms want.

    `grouped_mm` forces one path (tests compare them); None picks by the device, and
    low-precision (MXFP8) weights always take it."""
    if x.shape[0] == 0:
        return x.new_zeros(0, w2.shape[1])
    if grouped_mm is None:
        grouped_mm = _grouped_mm_available(x) or _low_precision(w1)
    if grouped_mm:
        offs = torch.cumsum(counts, 0, dtype=torch.int32)

        def mm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            w = w if _low_precision(w) else w.to(a.dtype)
            return torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
        return mm(F.silu(mm(x, w1)) * mm(x, w3), w2)
    outs = []
    # One host read of the counts per layer: the loop needs the split sizes.
    for e, rows in enumerate(x.split(counts.tolist())):
        if rows.shape[0]:
            outs.append((F.silu(rows @ w1[e].T) * (rows @ w3[e].T)) @ w2[e].T)
    return torch.cat(outs) if outs else x.new_zeros(0, w2.shape[1])


# ------------------------------------------------------------------------ module


class MoE(nn.Module):
    """Router + `n_routed_experts` SwiGLU experts (top_k per token) + optional shared
    SwiGLU expert that every token passes through; x [b, s, hidden] -> [b, s, hidden]."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        from trainbench.engine.models.transformer import MLP
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

    def compute_experts(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Routed experts on rows sorted by expert (counts [E]); the hook that expert
        parallelism (engine/parallel/ep.py) replaces with its dispatch and combine."""
        return grouped_swiglu(rows, counts, self.w1, self.w3, self.w2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_meta:
            # A shape-only pass: pipeline stages of older torch releases (before the 2.13
            # here) infer their output shapes by running the stage on the meta device.
            # Routing needs the token values (bincount has no meta kernel); the output
            # has x's shape.
            return torch.empty_like(x)
        b, s, h = x.shape
        tokens = x.reshape(-1, h)
        weights, ids, scores = self.route(tokens)
        k = self.top_k
        flat_ids = ids.flatten()
        counts = torch.bincount(flat_ids, minlength=self.n_experts)
        if self.training and torch.is_grad_enabled() and self.spec.bias_update_speed:
            self.expert_load += counts.to(self.expert_load.dtype)
        # Sort the T*k (token, slot) pairs by expert: each expert's rows become contiguous.
        order = torch.argsort(flat_ids, stable=True)
        token_of = order // k
        expert_out = self.compute_experts(tokens[token_of], counts)
        gate = weights.flatten()[order].unsqueeze(-1).to(expert_out.dtype)
        out = torch.zeros_like(tokens, dtype=expert_out.dtype).index_add_(
            0, token_of, expert_out * gate)
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
