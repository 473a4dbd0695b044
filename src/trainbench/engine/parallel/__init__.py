"""Parallelism, applied in one ordered place (torchtitan's order): FP8 conversion and
tensor parallel first, then activation checkpointing, then torch.compile per block,
then FSDP2 per block and on the root. Model code knows nothing of any of it.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch._inductor.config
import torch.distributed as dist
from torch import nn
from torch.distributed._symmetric_memory import enable_symm_mem_for_group
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.utils.checkpoint import checkpoint

from ...plan import FP8_DTYPES, Plan, compile_label
from ..models.mamba2 import Mamba2Mixer
from ..models.moe import MoE, moe_layers
from ..models.transformer import MLP, LayerNorm1p, RMSNorm
from . import cp, float8
from .cp import apply_context_parallel
from .ep import apply_expert_parallel, share_expert_load, share_sequence_counts
from .fsdp import apply_fsdp, keep_bf16_master_weights
from .mesh import ParallelDims
from .tp import apply_tensor_parallel


def apply_activation_checkpointing(model: nn.Module, mode: str) -> None:
    """'full': keep only each block's input and recompute the whole block in the backward.
    'selective': recompute only the attention core, softmax(QK^T)V, as Megatron's
    selective recompute does (Korthikanti et al. 2022), the NVIDIA recipes' choice: the
    cheapest part to recompute for the memory it frees, and what predict assumes."""
    if mode == "selective":
        # After context parallelism, which installs its own attend: the recomputation
        # then re-runs its key/value all-gather too.
        for module in model.modules():
            if callable(getattr(module, "heads", None)):
                # Multi-head latent attention: its heads are rebuilt from the latents
                # (up-projections, RoPE, core attention), as Megatron's selective
                # recompute of "mla_up_proj" rebuilds them (NVIDIA's DeepSeek-V3
                # recipes): the latents are kept instead of every head's q, k and v.
                module.heads = _recomputed(module.heads)
            elif callable(getattr(module, "attend", None)):
                module.attend = _recomputed(module.attend)
        return
    if mode != "full":
        return
    for key, block in list(model.layers.items()):
        model.layers[key] = checkpoint_wrapper(block, preserve_rng_state=False)


def _recomputed(fn):
    """`fn` keeping only its inputs for the backward, which runs it again."""
    def recomputed(*args) -> torch.Tensor:
        return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False)
    return recomputed


def keep_only_inputs_of_cheap_ops(model: nn.Module) -> None:
    """Norms, the MLP's and the MoE experts' activation function and the Mamba-2 mixer
    between its projections keep only their inputs for the backward and run again in it,
    as Megatron's fused
    kernels keep only a norm's input (and its statistics), a SwiGLU's two inputs and a
    mixer's in_proj output (mamba_split_conv1d_scan_combined). Left to autograd, a norm
    computed in fp32 keeps an fp32 copy of its input and the normalised tensor beside it,
    SwiGLU keeps silu(gate) beside gate and up, and the mixer keeps its conv, its scan's
    inner tensors and the gated norm's fp32 copies: measured on the real Llama 3.1 8B
    layer (FakeTensorMode, `check --trace`), 1.44 times the activations Megatron keeps
    and the memory model assumes, 1.00 times with this. The rerun is memory-bound passes
    (and the mixer's scan forward) inside a backward that reads the same tensors. Not
    under full recompute, which reruns the whole block and would run these a third time."""
    for module in model.modules():
        if isinstance(module, (RMSNorm, LayerNorm1p)):
            module.forward = _recomputed(module.forward)
        elif isinstance(module, (MLP, MoE)):
            module.activate = _recomputed(module.activate)
        elif isinstance(module, Mamba2Mixer):
            module.mix = _recomputed(module.mix)


def compile_description(plan: Plan) -> str:
    """What the log and run.json say of compilation: plan.compile_label, plus what stays
    eager inside compiled blocks."""
    label = compile_label(plan)
    if plan.compile and plan.model.is_moe:
        label += f"; {MOE_EAGER}"
    return label


# Measured on tiny Qwen3 MoE, CPU: with the expert loop compiled, every step's new
# routing recompiled it (6 recompiles in 3 steps; dynamo gives up after 8 and runs eager).
MOE_EAGER = ("routed experts eager (dropless routing gives each expert a data-dependent "
             "row count, which recompiles a compiled expert loop at every new routing)")


def compile_report() -> str:
    """How the compiled blocks came out after the first step: the graphs compiled and the
    graph breaks among them. A break splits a block into graphs with eager code between
    (fewer fusions, a host round-trip each); sequence parallelism's shard-keeping gather
    broke every block before it ran inside the graph (tp.recomputed_in_backward)."""
    from torch._dynamo.utils import counters
    breaks = sum(counters["graph_break"].values())
    return (f"compiled {counters['stats']['unique_graphs']} graphs in the first step, "
            f"{breaks} graph break{'s' if breaks != 1 else ''}")


def apply_compile(model: nn.Module) -> None:
    """torch.compile each block, as torchtitan does: one graph per block shape, reused by
    every block of that shape (parameters are graph inputs), so the compile cost does not
    grow with depth. After activation checkpointing: compiling the checkpoint wrapper
    lets the compiled graph hold the recomputation too, and before FSDP, whose per-block
    hooks then run outside the compiled region, as FSDP2 expects."""
    for moe in moe_layers(model):
        # The router, sort, gather, combine and shared expert stay in the block's graph;
        # only the per-expert computation (or expert parallelism's dispatch, which
        # replaced this hook before) runs eager, between two graphs.
        moe.compute_experts = torch.compiler.disable(moe.compute_experts)
    for key, block in list(model.layers.items()):
        inner = getattr(block, "_checkpoint_wrapped_module", None)
        if inner is not None and moe_layers(inner):
            # The experts' graph break inside a checkpointed block makes Dynamo skip the
            # checkpoint wrapper's frame after the first step, and with it every block
            # (they share the wrapper's code): measured on tiny DeepSeek-V3, full
            # recompute, no compiled graph ran after step 0. The block compiled inside
            # its checkpoint runs its graphs every step; the checkpoint recomputes them.
            # In place (Module.compile): its parameters keep their names, which the CPU
            # initialisation and checkpoints match by (an OptimizedModule inside the
            # wrapper would add `_orig_mod` to them).
            inner.compile(fullgraph=False)
        else:
            model.layers[key] = torch.compile(block, fullgraph=False)


def parallelize(model: nn.Module, plan: Plan, dims: ParallelDims,
                compute_dtype: torch.dtype) -> nn.Module:
    if plan.master_weights == "bf16":
        keep_bf16_master_weights(model)
    if plan.dtype in FP8_DTYPES:
        float8.convert(model, plan, dist.get_backend() if dist.is_initialized() else "gloo")
    if dims.tp_enabled:
        apply_tensor_parallel(model, dims["tp"], plan)
        if plan.async_tp:  # plan validation admits it on CUDA with compile only
            enable_async_tp(dims["tp"])
    if dims.cp_enabled:
        apply_context_parallel(model, dims["cp"], plan.cp_impl, keep_shard=cp.keeps_shard(plan))
    if dims.ep_enabled:
        apply_expert_parallel(model, dims["ep"])
    if plan.model.is_moe:
        share_moe_statistics(model, dims)
    if plan.recompute != "full":
        keep_only_inputs_of_cheap_ops(model)
    apply_activation_checkpointing(model, plan.recompute)
    if plan.compile:
        apply_compile(model)
    if plan.one_rank_without_fsdp:
        return model
    # FSDP wraps the model on a one-rank dp_cp mesh too (TP-only or PP-only layouts), so
    # every multi-rank layout runs the same mixed-precision code path.
    # Weights gathered once a step stay gathered after forward (the schedule or the
    # trainer's before_microbatch decides when they are resharded).
    apply_fsdp(model, dims["dp_cp"], compute_dtype,
               reshard_after_forward=not plan.weights_kept_gathered,
               moe_meshes=moe_fsdp_meshes(dims) if plan.model.is_moe else None,
               prefetch=plan.fsdp_prefetch,
               reduce_dtype=torch.bfloat16 if plan.reduce_dtype == "bf16" else torch.float32)
    return model


def share_moe_statistics(model: nn.Module, dims: ParallelDims) -> None:
    """The MoE layers' balance-loss counts summed over the ranks that hold parts of one
    sequence, and DeepSeek-V3's expert load over every rank that routes other tokens.
    Under TP the layer is token-local (tp.MoETokenLocal): its TP ranks are both."""
    parts = (dims["cp_tp"] if dims.cp_enabled and dims.tp_enabled
             else dims["cp"] if dims.cp_enabled else dims["tp"] if dims.tp_enabled else None)
    if parts is not None:
        share_sequence_counts(model, parts.get_group())
    routing = moe_routing_mesh(dims)
    if routing.size() > 1:
        share_expert_load(model, routing.get_group())


def moe_routing_mesh(dims: ParallelDims) -> DeviceMesh:
    """The ranks whose MoE layers route different tokens: data and context ranks, and the
    tensor ranks where the layer is token-local (under TP)."""
    return dims["dp_cp_tp"] if dims.tp_enabled else dims["dp_cp"]


def moe_fsdp_meshes(dims: ParallelDims) -> tuple[DeviceMesh, DeviceMesh] | None:
    """(router and shared expert, routed experts) FSDP meshes of an MoE layer, or None
    where it is sharded with its block: under TP its parameters are token-local, so
    shared over the ranks that route different tokens (the tensor ranks too); under EP
    the routed experts over the ranks that hold the same ones (ep.py)."""
    if not (dims.ep_enabled or dims.tp_enabled):
        return None
    dense = moe_routing_mesh(dims)
    return dense, dims["dp_mod_ep"] if dims.ep_enabled else dense


def enable_async_tp(tp_mesh: DeviceMesh) -> None:
    """Asynchronous TP (torchtitan's form): inductor splits each TP all-gather+matmul and
    matmul+reduce-scatter into chunks that overlap over symmetric memory. It acts only
    in compiled graphs and needs NCCL on CUDA."""
    torch._inductor.config._micro_pipeline_tp = True
    enable_symm_mem_for_group(tp_mesh.get_group().group_name)


def clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float,
                    pp_mesh: DeviceMesh | None = None) -> torch.Tensor:
    """Clip gradients to `max_norm` by their global L2 norm; return that norm (fp32).

    Global means over the whole model: every FSDP and TP shard (DTensor norms reduce
    over their mesh and count replicas once) and, under a pipeline, every stage (the
    squared norms of the stages are summed over the pp group). Gradients are grouped by
    mesh because norms of DTensors on different meshes cannot be combined directly.
    """
    params = [p for p in parameters if p.grad is not None]
    by_mesh: dict[object, list[torch.Tensor]] = {}
    for p in params:
        by_mesh.setdefault(getattr(p.grad, "device_mesh", None), []).append(p.grad)
    device = params[0].grad.device if params else torch.device("cpu")
    total_sq = torch.zeros((), device=device, dtype=torch.float32)
    for grads in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        total_sq += norm.float() ** 2
    if pp_mesh is not None:
        dist.all_reduce(total_sq, op=dist.ReduceOp.SUM, group=pp_mesh.get_group())
    total = total_sq.sqrt()
    # One call per mesh: a foreach kernel cannot mix DTensors of different meshes
    # (expert parallelism puts the routed experts on their own).
    for mesh in by_mesh:
        torch.nn.utils.clip_grads_with_norm_(
            [p for p in params if getattr(p.grad, "device_mesh", None) == mesh],
            max_norm, total, foreach=True)
    return total
