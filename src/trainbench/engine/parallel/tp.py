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

import math
from fnmatch import fnmatch
from functools import partial
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                    create_selective_checkpoint_contexts)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

from trainbench.engine.models.moe import MoE

from ...plan import Plan
from .ep import scale_grad
from .float8 import tp_style


def storage_key(t: torch.Tensor) -> int:
    """Identity of the memory behind `t` (a DTensor's: its local tensor's), the same for
    every view and detached alias of it: what a saved-tensor hook matches a saved tensor
    with, whether autograd saved the tensor itself, a view, or a compiled graph its input."""
    local = t._local_tensor if isinstance(t, DTensor) else t
    return local.untyped_storage()._cdata


class _Regathered:
    """A saved tensor that the backward rebuilds instead of keeping: `rebuild()` gives
    the tensor it was a view of (once per forward, shared by every saved view of it and
    released with the last of them), and the view is taken again from it."""

    def __init__(self, cache: dict, rebuild, saved: torch.Tensor, index: int):
        self.cache, self.rebuild, self.index = cache, rebuild, index
        self.dtensor = _is_dtensor(saved)
        self.shape = saved.shape
        self.strides = None if self.dtensor else (saved.stride(), saved.storage_offset())

    def unpack(self) -> torch.Tensor:
        if "whole" not in self.cache:
            with torch.no_grad():
                self.cache["whole"] = self.rebuild()
        whole = self.cache["whole"][self.index]
        if self.dtensor:
            return whole.view(self.shape)
        # A plain tensor in a DTensor's memory: what a compiled graph saves of its input.
        local = whole._local_tensor if _is_dtensor(whole) else whole
        return local.as_strided(self.shape, *self.strides)


def regathered_in_backward(wholes: tuple[torch.Tensor, ...], rebuild):
    """A saved_tensors_hooks context in which any tensor saved for the backward that lives
    in the memory of one of `wholes` (gathered tensors: a sequence-parallel layer's whole
    sequence input, context parallelism's whole-sequence keys and values) is not kept:
    the backward calls `rebuild()`, which gathers them again from the rank's shards and
    returns them in the same order and layout, and takes each saved view from it.

    Megatron keeps the shard and gathers again in the backward (its
    LinearWithGradAccumulationAndAsyncCommunication, Korthikanti et al. 2022, sec. 4.2.2);
    torch's ColwiseParallel and an all-gather attention would keep the whole sequence.
    The saved values are the same, so losses and gradients are unchanged. Never inside a
    non-reentrant checkpoint of the same tensors (full recompute): the innermost hooks
    win, and the checkpoint would keep what it means to drop."""
    # Autograd keeps both hooks with every tensor saved under them, the tensors kept
    # whole included: the hooks must hold no reference to the wholes themselves.
    keys = {storage_key(w): (i, _is_dtensor(w)) for i, w in enumerate(wholes)}
    cache: dict = {}

    def pack(t: torch.Tensor):
        index, dtensor = keys.get(storage_key(t), (None, False))
        if index is None:
            return t
        if _is_dtensor(t) and not (dtensor and t.is_contiguous()):
            return t  # a DTensor view that view() cannot take again
        return _Regathered(cache, rebuild, t, index)

    def unpack(packed):
        return packed.unpack() if isinstance(packed, _Regathered) else packed

    return saved_tensors_hooks(pack, unpack)


def _recompute_all(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_RECOMPUTE


def recomputed_in_backward(fn, *args):
    """`fn(*args)` inside a compiled graph, its results never saved for the backward:
    AOTAutograd's partitioner recomputes everything `fn` computes (selective activation
    checkpointing's MUST_RECOMPUTE, the way torchtitan's SimpleFSDP frees gathered
    weights) from `args`, which the backward then needs instead."""
    return checkpoint(fn, *args, use_reentrant=False,
                      context_fn=partial(create_selective_checkpoint_contexts, _recompute_all))


def _is_dtensor(t: torch.Tensor) -> bool:
    return getattr(t, "_local_tensor", None) is not None


class GatherSequence(ParallelStyle):
    """All-gather a sequence-sharded first input (later inputs, e.g. RoPE, pass as they
    are), and keep only the shard for the backward (`keep_shard`): the whole-sequence
    input that the module's column-parallel linears would save is gathered again in
    the backward (regathered_in_backward), as Megatron does. The all-gather's own
    backward reduce-scatters the input gradient, as PrepareModuleInput's does.

    `local_output`: the module gets a plain tensor rather than a Replicate DTensor.
    """

    def __init__(self, keep_shard: bool = True, local_output: bool = False):
        super().__init__()
        self.keep_shard = keep_shard
        self.local_output = local_output

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        inner = module.forward
        keep_shard, local_output = self.keep_shard, self.local_output

        def gather(shard: torch.Tensor):
            whole = DTensor.from_local(shard, device_mesh, [Shard(1)], run_check=False
                                       ).redistribute(device_mesh, [Replicate()])
            return whole.to_local() if local_output else whole

        def forward(x: torch.Tensor, *args, **kwargs):
            shard = x.to_local() if isinstance(x, DTensor) else x
            if keep_shard and torch.is_grad_enabled() and torch.compiler.is_compiling():
                return inner(recomputed_in_backward(gather, shard), *args, **kwargs)
            whole = gather(shard)
            if not (keep_shard and torch.is_grad_enabled()):
                return inner(whole, *args, **kwargs)
            with regathered_in_backward((whole,), lambda: (gather(shard.detach()),)):
                return inner(whole, *args, **kwargs)

        module.forward = forward
        return module


def _gather_input(keep_shard: bool = True) -> GatherSequence:
    """All-gather a sequence-sharded first input; the shard alone kept for the backward."""
    return GatherSequence(keep_shard=keep_shard)


def _attention_styles(prefix: str, keep_shard: bool = True) -> dict[str, ParallelStyle]:
    """q/k/v split by heads, out-projection by input rows back to a sequence shard."""
    return {
        prefix: _gather_input(keep_shard),  # called as attention(x, rope)
        f"{prefix}.wq": ColwiseParallel(),
        f"{prefix}.wk": ColwiseParallel(),
        f"{prefix}.wv": ColwiseParallel(),
        f"{prefix}.wo": RowwiseParallel(output_layouts=Shard(1)),
    }


def _mlp_styles(prefix: str, keep_shard: bool = True) -> dict[str, ParallelStyle]:
    """Gate/up split by FFN columns, down by FFN rows (a squared-ReLU MLP has no w3)."""
    return {
        prefix: _gather_input(keep_shard),
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

def keeps_shard(plan: Plan | None) -> bool:
    """Whether the sequence-parallel gathers keep only the shard for the backward
    (GatherSequence; Plan.sequence_shard_kept). Not under full recompute, whose hooks
    must not be nested with ours."""
    return plan is None or plan.sequence_shard_kept


def transformer_plan(keep_shard: bool = True) -> dict[str, ParallelStyle]:
    """Llama and Nemotron-4 (engine/models/transformer.py)."""
    return {
        **EDGE_PLAN,
        "layers.*.attention_norm": SequenceParallel(),
        **_attention_styles("layers.*.attention", keep_shard),
        "layers.*.mlp_norm": SequenceParallel(),
        **_mlp_styles("layers.*.mlp", keep_shard),
    }


TRANSFORMER_PLAN = transformer_plan()


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
        _gather_input(keeps_shard(self.plan))._apply(module, device_mesh)
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
            styles.update(_attention_styles(f"layers.{key}.mixer", keeps_shard(plan)))
        else:
            styles.update(_mlp_styles(f"layers.{key}.mixer", keeps_shard(plan)))
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


def qwen3_moe_plan(keep_shard: bool = True) -> dict[str, ParallelStyle]:
    """Qwen3 MoE (engine/models/qwen3_moe.py)."""
    return {
        **EDGE_PLAN,
        "layers.*.attention_norm": SequenceParallel(),
        **_attention_styles("layers.*.attention", keep_shard),
        # QK-norm normalises each head over head_dim with one weight shared by all heads:
        # it runs on this rank's heads as they are (dim 2 of [b, s, heads, head_dim]). Its
        # weight is a replicated DTensor so that the partial gradients of the heads on
        # each rank are summed over TP.
        "layers.*.attention.q_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
        "layers.*.attention.k_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
        "layers.*.mlp_norm": SequenceParallel(),
        **_moe_styles("layers.*.moe"),
    }


QWEN3_MOE_PLAN = qwen3_moe_plan()


class _SumGradOverTP(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the TP ranks (Megatron's "copy
    to tensor-parallel region")."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _MLAttentionInput(GatherSequence):
    """DeepSeek-V3's MLA under TP: the sequence gathered in (as for any attention; the
    shard kept for the backward), and the shared RoPE key's gradient summed over the
    ranks, whose heads each read it."""

    def __init__(self, keep_shard: bool = True):
        # A local tensor in: the replicated down-projections are plain modules.
        super().__init__(keep_shard=keep_shard, local_output=True)

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
    styles: dict[str, ParallelStyle] = dict(EDGE_PLAN)
    for key, block in model.layers.items():
        prefix = f"layers.{key}"
        styles[f"{prefix}.attention_norm"] = SequenceParallel()
        styles[f"{prefix}.attention"] = _MLAttentionInput(keeps_shard(plan))
        for name in ("wq", "wq_b", "wkv_b"):
            styles[f"{prefix}.attention.{name}"] = ColwiseParallel()
        styles[f"{prefix}.attention.wo"] = RowwiseParallel(output_layouts=Shard(1))
        styles[f"{prefix}.mlp_norm"] = SequenceParallel()
        styles.update(_moe_styles(f"{prefix}.mlp") if isinstance(block.mlp, MoE)
                      else _mlp_styles(f"{prefix}.mlp", keeps_shard(plan)))
    return styles


PLANS: dict[str, Callable[[nn.Module, Plan | None], dict[str, ParallelStyle]]] = {
    "llama": lambda model, plan: transformer_plan(keeps_shard(plan)),
    "nemotron4": lambda model, plan: transformer_plan(keeps_shard(plan)),
    "nemotronh": nemotronh_plan,
    "qwen3_moe": lambda model, plan: qwen3_moe_plan(keeps_shard(plan)),
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

    backend = dist.get_backend() if dist.is_initialized() else "gloo"
    return {name: style if _fed_by_gather(style, plan) else
            tp_style(style, model.get_submodule(name), plan, backend)
            for name, style in styles.items()}


def _fed_by_gather(style: ParallelStyle, plan: Plan) -> bool:
    """A column-parallel linear whose input a GatherSequence has already gathered (a
    Replicate input) keeps the plain style around its Float8Linear: torchao's
    Float8ColwiseParallel would cast that whole-sequence input to FP8 in each linear and
    keep the cast copy for the backward, where GatherSequence keeps only the shard. Its
    TP traffic is the same: the gather before it and the reduce-scatter of the input
    gradient after it are GatherSequence's, in bf16, under either style."""
    return (keeps_shard(plan) and type(style) is ColwiseParallel
            and tuple(style.input_layouts) == (Replicate(),))
