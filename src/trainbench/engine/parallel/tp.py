"""Tensor + sequence parallelism with DTensor's `parallelize_module` (Megatron's layout).

Inside a block, the projections that fan out (q, k, v; the MLP's gate and up) are split
by output columns and the ones that fan in (attention out, MLP down) by input rows, so
each rank runs its share of the heads and of the FFN with no communication in between.
Between blocks the residual stream is split along the sequence (sequence parallel): the
norms run on a sequence shard, an all-gather feeds each attention/MLP and a
reduce-scatter leaves it. The embedding is split by vocabulary rows, and the output head
by vocabulary columns, whose logits stay sharded into a `loss_parallel` cross-entropy:
the full [tokens, vocab] logits never exist on one rank.

A family supplies only its plan: module-name patterns (fnmatch, '*' for a layer
index) mapped to styles. Llama and Nemotron-4 share TRANSFORMER_PLAN; Nemotron-H builds
its plan per layer kind and splits each Mamba-2 mixer by heads and groups as Megatron
does (`MambaMixerParallel`).
"""

from __future__ import annotations

from fnmatch import fnmatch
from typing import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from ...plan import Plan


def _gather_input(extra_args: int = 0) -> PrepareModuleInput:
    """All-gather a sequence-sharded first input (later inputs, e.g. RoPE, pass as they are)."""
    return PrepareModuleInput(input_layouts=(Shard(1),) + (None,) * extra_args,
                              desired_input_layouts=(Replicate(),) + (None,) * extra_args)


def _attention_styles(prefix: str) -> dict[str, ParallelStyle]:
    """q/k/v split by heads, out-projection by input rows back to a sequence shard."""
    return {
        prefix: _gather_input(extra_args=1),  # called as attention(x, rope)
        f"{prefix}.wq": ColwiseParallel(),
        f"{prefix}.wk": ColwiseParallel(),
        f"{prefix}.wv": ColwiseParallel(),
        f"{prefix}.wo": RowwiseParallel(output_layouts=Shard(1)),
    }


def _mlp_styles(prefix: str) -> dict[str, ParallelStyle]:
    """Gate/up split by FFN columns, down by FFN rows (a squared-ReLU MLP has no w3)."""
    return {
        prefix: _gather_input(),
        f"{prefix}.w1": ColwiseParallel(),
        f"{prefix}.w3": ColwiseParallel(),
        f"{prefix}.w2": RowwiseParallel(output_layouts=Shard(1)),
    }


class VocabParallelEmbedding(ParallelStyle):
    """The embedding split by vocabulary rows (Megatron's VocabParallelEmbedding), its
    output left as a sequence shard.

    Each rank looks up only the tokens in its own rows (the others give zeros), and the
    partial sums are reduce-scattered along the sequence. The weight's gradient is then
    the rank's own rows. DTensor's RowwiseParallel embedding instead gave every TP rank
    the gradient of the whole vocabulary (a Replicate [vocab, hidden] gradient beside the
    [vocab/tp, hidden] shard: measured with torch's MemTracker on one TP8 rank of an
    8192 x 256 embedding, 9 MiB of temporaries for a 1 MiB shard; on the first stage of
    Nemotron-4 340B, 18.9 GB in fp32).

    `copy_output` (compiled blocks only): the shard comes out of the reduce-scatter as an
    AsyncCollectiveTensor (the wait is deferred to its first use). Fed as it is into a
    torch.compile'd block, the compiled backward returned a zero gradient for it (torch
    2.13, gloo: the embedding never learned under TP with compile, while every block's
    own gradients were right). An eager copy waits for the collective and hands the
    block a plain tensor with its autograd history; it costs one [b, s/tp, hidden] copy
    per microbatch. Eager blocks take the shard as it is (tests/test_parallel_parity.py).
    """

    def __init__(self, copy_output: bool = False):
        super().__init__()
        self.copy_output = copy_output

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        import math

        import torch.nn.functional as F
        from torch.distributed.tensor import DTensor, Partial
        vocab = module.weight.shape[0]
        module.register_parameter("weight", nn.Parameter(
            distribute_tensor(module.weight, device_mesh, [Shard(0)])))
        # torch.chunk's split, as Shard(0)'s: every rank but the last holds ceil(vocab/tp).
        start = device_mesh.get_local_rank() * math.ceil(vocab / device_mesh.size())
        copy = self.copy_output

        def forward(tokens: torch.Tensor) -> torch.Tensor:
            rows = module.weight.to_local()
            outside = (tokens < start) | (tokens >= start + rows.shape[0])
            mine = F.embedding((tokens - start).masked_fill(outside, 0), rows)
            mine = mine.masked_fill(outside.unsqueeze(-1), 0)
            out = DTensor.from_local(mine, device_mesh, [Partial()], run_check=False)
            out = out.redistribute(device_mesh, [Shard(1)]).to_local()
            return out.clone() if copy else out

        module.forward = forward
        return module


# Embedding, final norm and output head: the same for every family here.
EDGE_PLAN: dict[str, ParallelStyle] = {
    "tok_embeddings": VocabParallelEmbedding(),
    "norm": SequenceParallel(),
    # Logits stay a DTensor sharded over the vocabulary, for loss_parallel.
    "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
                              use_local_output=False),
}

TRANSFORMER_PLAN: dict[str, ParallelStyle] = {
    **EDGE_PLAN,
    "layers.*.attention_norm": SequenceParallel(),
    **_attention_styles("layers.*.attention"),
    "layers.*.mlp_norm": SequenceParallel(),
    **_mlp_styles("layers.*.mlp"),
}
"""Llama and Nemotron-4 (engine/models/transformer.py)."""


def _mamba_linear_styles() -> dict[str, ParallelStyle]:
    return {"in_proj": ColwiseParallel(), "out_proj": RowwiseParallel(output_layouts=Shard(1))}


def row_parallel_linears() -> frozenset[str]:
    """Names of the linear layers TP splits by input features (all others it splits by
    output features), read from the plans above: what the CPU peak needs to time each
    layer at the shape one rank really computes."""
    styles = {**_attention_styles("a"), **_mlp_styles("m"), **_mamba_linear_styles()}
    return frozenset(name.rsplit(".", 1)[-1] for name, style in styles.items()
                     if isinstance(style, RowwiseParallel))


class MambaMixerParallel(ParallelStyle):
    """Split a Mamba-2 mixer by heads and groups, as Megatron does (see mamba2.py).

    Rank r keeps a contiguous block of H/T heads and the G/T groups they read, which is
    again a complete, smaller mixer: in_proj column-parallel, out_proj row-parallel, the
    per-channel conv and per-head parameters sharded along their first axis, and no
    communication inside. The mixer stores in_proj's rows and conv1d's channels grouped
    by B/C group (mamba2.py), so a rank's rows are one contiguous block of the full
    model's order: plain Shard(0) everywhere, and a checkpoint saved in any layout
    holds the same tensors in the same order.
    """

    def __init__(self, plan: Plan | None = None):
        super().__init__()
        self.plan = plan

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        tp = device_mesh.size()
        if module.n_groups % tp or module.n_heads % tp:
            raise ValueError(f"Mamba heads {module.n_heads} and groups {module.n_groups} "
                             f"must be divisible by TP={tp}")
        styles = _mamba_linear_styles()
        if self.plan is not None:
            styles = with_float8_styles(module, styles, self.plan)
        parallelize_module(module, device_mesh, styles)
        _gather_input()._apply(module, device_mesh)
        for name in ("conv1d.weight", "conv1d.bias", "ssm.dt_bias", "ssm.A_log", "ssm.D",
                     "norm_weight"):
            owner_name, _, attr = name.rpartition(".")
            owner = module.get_submodule(owner_name)
            param = getattr(owner, attr)
            sharded = nn.Parameter(distribute_tensor(param, device_mesh, [Shard(0)]),
                                   requires_grad=param.requires_grad)
            if getattr(param, "_no_weight_decay", False):
                sharded._no_weight_decay = True
            owner.register_parameter(attr, sharded)
        # The forward reads every size from these two: now this rank's share.
        module.n_heads //= tp
        module.n_groups //= tp
        return module


def nemotronh_plan(model: nn.Module, plan: Plan | None = None) -> dict[str, ParallelStyle]:
    """Nemotron-H: each block's norm sequence-parallel, its mixer split by its kind."""
    styles: dict[str, ParallelStyle] = dict(EDGE_PLAN)
    for key, block in model.layers.items():
        styles[f"layers.{key}.norm"] = SequenceParallel()
        if block.kind == "M":
            styles[f"layers.{key}.mixer"] = MambaMixerParallel(plan)
        elif block.kind == "*":
            styles.update(_attention_styles(f"layers.{key}.mixer"))
        else:
            styles.update(_mlp_styles(f"layers.{key}.mixer"))
    return styles


class MoETokenLocal(ParallelStyle):
    """A mixture of experts under TP (Megatron-Core's ETP 1 layout): each TP rank routes
    and computes only its own sequence shard, with whole experts.

    The layer takes the shard of the residual stream as a plain tensor and gives its
    output back as one: the router, the routed experts and the shared expert are not
    split, and no rank computes another's tokens (expert parallelism, which may span
    the TP ranks, sends each token slot to its expert's rank). Their parameters are
    then replicated over TP, and each TP rank's gradient holds its own tokens' part
    only: FSDP reduces them over the data, context and tensor ranks together
    (engine/parallel/ep.py), a mean over dp x cp x tp where the whole gradient is the
    sum over tp and the mean over dp x cp. The layer's output gradient is therefore
    multiplied by tp on the way in, and its input gradient by 1/tp on the way out,
    which leaves the gradient that flows on through the block as it was. The balance
    loss's gradient enters in between, unscaled: the whole sequence's balance loss is
    the mean of the TP ranks' (each takes the whole sequence's expert counts,
    `MoE.sequence_counts`, with its own tokens' router probabilities), and 1/tp of
    the tp-scaled sum is that mean.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        from torch.distributed.tensor import DTensor

        from .ep import scale_grad
        tp = device_mesh.size()

        def local_in(mod, args):
            x = args[0].to_local() if isinstance(args[0], DTensor) else args[0]
            return (scale_grad(x, 1.0 / tp),) + tuple(args[1:])

        def scaled_out(mod, args, out):
            # A copy: FSDP, which wraps the layer, warns at every forward on a view output.
            return scale_grad(out, float(tp)).clone()

        module.register_forward_pre_hook(local_in)
        module.register_forward_hook(scaled_out)
        return module


def _moe_styles(prefix: str) -> dict[str, ParallelStyle]:
    """A mixture of experts under TP: token-local (MoETokenLocal), nothing inside split."""
    return {prefix: MoETokenLocal()}


QWEN3_MOE_PLAN: dict[str, ParallelStyle] = {
    **EDGE_PLAN,
    "layers.*.attention_norm": SequenceParallel(),
    **_attention_styles("layers.*.attention"),
    # QK-norm normalises each head over head_dim with one weight shared by all heads:
    # it runs on this rank's heads as they are (dim 2 of [b, s, heads, head_dim]). Its
    # weight is a replicated DTensor so that the partial gradients of the heads on each
    # rank are summed over TP.
    "layers.*.attention.q_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
    "layers.*.attention.k_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
    "layers.*.mlp_norm": SequenceParallel(),
    **_moe_styles("layers.*.moe"),
}
"""Qwen3 MoE (engine/models/qwen3_moe.py)."""


class _SumGradOverTP(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the TP ranks (Megatron's "copy
    to tensor-parallel region")."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        import torch.distributed as dist
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _MLAttentionInput(PrepareModuleInput):
    """DeepSeek-V3's MLA under TP: the sequence gathered in (as for any attention), and the
    shared RoPE key's gradient summed over the ranks, whose heads each read it."""

    def __init__(self):
        # A local tensor in: the replicated down-projections are plain modules.
        super().__init__(input_layouts=(Shard(1), None),
                         desired_input_layouts=(Replicate(), None), use_local_output=True)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        module = super()._apply(module, device_mesh)
        group = device_mesh.get_group()
        module.shared_rope_key = lambda k_rope: _SumGradOverTP.apply(k_rope, group)
        return module


def deepseek_v3_plan(model: nn.Module, plan: Plan | None = None) -> dict[str, ParallelStyle]:
    """DeepSeek-V3: MLA's up-projections (q_b, kv_b; q when it has no low-rank query)
    split by heads and its out-projection by rows; the low-rank down-projections
    (q_a, kv_a) and their norms replicated, so each rank rebuilds its own heads from the
    whole latent. Their gradients come out whole on every rank: the column-parallel
    up-projections sum their input gradient over TP, and the shared RoPE key's gradient
    is summed by _MLAttentionInput. The dense blocks' MLP split as usual, the MoE blocks'
    as in _moe_styles."""
    from trainbench.engine.models.moe import MoE
    styles: dict[str, ParallelStyle] = dict(EDGE_PLAN)
    for key, block in model.layers.items():
        prefix = f"layers.{key}"
        styles[f"{prefix}.attention_norm"] = SequenceParallel()
        styles[f"{prefix}.attention"] = _MLAttentionInput()
        for name in ("wq", "wq_b", "wkv_b"):
            styles[f"{prefix}.attention.{name}"] = ColwiseParallel()
        styles[f"{prefix}.attention.wo"] = RowwiseParallel(output_layouts=Shard(1))
        styles[f"{prefix}.mlp_norm"] = SequenceParallel()
        mlp = _moe_styles if isinstance(block.mlp, MoE) else _mlp_styles
        styles.update(mlp(f"{prefix}.mlp"))
    return styles


PLANS: dict[str, Callable[[nn.Module, Plan | None], dict[str, ParallelStyle]]] = {
    "llama": lambda model, plan: TRANSFORMER_PLAN,
    "nemotron4": lambda model, plan: TRANSFORMER_PLAN,
    "nemotronh": nemotronh_plan,
    "qwen3_moe": lambda model, plan: QWEN3_MOE_PLAN,
    "deepseek_v3": deepseek_v3_plan,
}
"""Family -> its tensor-parallel plan. A new family adds one entry."""


def resolve_plan(model: nn.Module, plan: dict[str, ParallelStyle]) -> dict[str, ParallelStyle]:
    """Pattern -> style becomes module name -> style for the modules this model holds.

    A pipeline stage lacks some modules (embedding, head, other stages' layers) and a
    squared-ReLU MLP has no w3: patterns that match nothing here are skipped.
    """
    names = [name for name, _ in model.named_modules() if name]
    resolved: dict[str, ParallelStyle] = {}
    for pattern, style in plan.items():
        for name in names:
            if fnmatch(name, pattern) and name.count(".") == pattern.count("."):
                resolved[name] = style
    return resolved


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, plan: Plan) -> None:
    """Shard `model` (on the meta device) over `tp_mesh` by its family's plan."""
    family = plan.model.family
    if family not in PLANS:
        raise ValueError(f"no tensor-parallel plan for model family {family!r}; "
                         f"families with one: {', '.join(PLANS)}")
    styles = resolve_plan(model, PLANS[family](model, plan))
    if plan.compile and "tok_embeddings" in styles:
        styles["tok_embeddings"] = VocabParallelEmbedding(copy_output=True)
    parallelize_module(model, tp_mesh, with_float8_styles(model, styles, plan))


def with_float8_styles(model: nn.Module, styles: dict[str, ParallelStyle],
                       plan: Plan) -> dict[str, ParallelStyle]:
    """Module name -> style, with torchao's Float8 TP styles for the layers FP8 converted
    (parallel/float8.py); the same dict when the run is not FP8."""
    if plan.dtype != "fp8":  # MXFP8 layers take the plain styles (bf16 TP traffic)
        return styles
    import torch.distributed as dist

    from .float8 import tp_style
    backend = dist.get_backend() if dist.is_initialized() else "gloo"
    return {name: tp_style(style, model.get_submodule(name), plan, backend)
            for name, style in styles.items()}
