"""Build one rank of a plan as the engine does, on the meta device, under a fake process
group of the plan's world size, and count what the rank holds.

The rank's model comes from the engine's own code path (Trainer.build_model: meta
device, pipeline split, FP8 conversion, TP, CP, activation checkpointing, FSDP2, in the
engine's order) with materialisation skipped, so a 405B rank costs seconds and no
memory. The fake backend answers every collective without communicating; a process
group can be destroyed and made again for the next rank in the same process.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed.pipelining import _utils, schedules, stage as pipeline_stage
from torch.distributed.tensor import DTensor, _redistribute, _sharding_prop
from torch.testing._internal.distributed.fake_pg import FakeStore

from ..engine.optim import build_optimizer
from ..engine.parallel import cp
from ..engine.parallel.fsdp import fp32_units
from ..engine.parallel.mesh import ParallelDims
from ..engine.trainer import Trainer
from ..layout import rank_coordinates, rank_stages
from ..plan import Plan
from ..predict.memory import GATHERED_VIRTUAL_STAGES, stage_message_shape
from .fused_attention import fused_attention_memory
from .grouped_fp8 import fake_fp8_grouped_kernels
from .routing import BalancedRoutingFakeMode, balanced_routing

_COMPUTE_BYTES = {"bf16": 2, "fp8": 2, "mxfp8": 2, "fp32": 4}


def _tp_local_numel(param: torch.Tensor, tp_coordinate: int, tp: int) -> tuple[int, bool]:
    """Elements of `param` this rank's tensor-parallel shard holds before FSDP shards it,
    and whether the parameter is replicated (the same) over the `tp` ranks.

    Routed experts are sharded over ep instead (whole experts, an equal share per rank,
    engine/parallel/ep.py): this rank holds 1/ep of them, and EP spans the TP ranks
    first (engine/parallel/mesh.py), so under TP each TP rank holds its own."""
    shape = list(param.shape)
    mesh = getattr(param, "device_mesh", None)
    names = mesh.mesh_dim_names if mesh is not None else None
    if names and "ep" in names and param.placements[names.index("ep")].is_shard():
        return math.prod(shape) // mesh.size(names.index("ep")), tp == 1
    if not names or "tp" not in names:
        return math.prod(shape), True
    placement = param.placements[names.index("tp")]
    if not placement.is_shard():
        return math.prod(shape), True
    # torch.chunk's split: every rank but the last holds ceil(n / k) along the dim.
    dim, k = placement.dim, mesh.size(names.index("tp"))
    per = math.ceil(shape[dim] / k)
    shape[dim] = max(0, min(per, shape[dim] - tp_coordinate * per))
    return math.prod(shape), False


def _stage_info(index: int, part: nn.Module) -> dict:
    return {"stage": index,
            "layers": sorted(int(k) for k in part.layers.keys()),
            "embedding": getattr(part, "tok_embeddings", None) is not None,
            "output": getattr(part, "output", None) is not None}


def count_rank(plan: Plan, rank: int, stage_indices: list[int], parts: list[nn.Module]) -> dict:
    """What a built rank holds: parameter counts and the bytes of its model state."""
    tp_coordinate = rank_coordinates(rank, plan)["tp"]
    compute = _COMPUTE_BYTES[plan.dtype]
    local = tp_local = tp_replicated = unsharded = 0
    param_bytes = 0
    part_gathered = []
    for part in parts:
        part_gathered.append(0)
        fp32_params = {id(p) for unit in fp32_units(part) for p in unit.parameters()}
        for param in part.parameters():
            held = param.to_local() if hasattr(param, "to_local") else param
            local += held.numel()
            param_bytes += held.numel() * held.element_size()
            n, replicated = _tp_local_numel(param, tp_coordinate, plan.layout.tp)
            tp_local += n
            tp_replicated += n if replicated else 0
            unsharded += param.numel()
            # FSDP all-gathers this rank's TP shard in the compute dtype, except the units
            # that keep fp32 (Mamba's dt_bias, A_log, D).
            part_gathered[-1] += n * (4 if id(param) in fp32_params else compute)
    gathered_bytes = sum(part_gathered)
    single = plan.gpus == 1
    info = {
        "rank": rank,
        **rank_coordinates(rank, plan),
        "stages": [_stage_info(i, p) for i, p in zip(stage_indices, parts)],
        "params_local": local,
        "params_tp_local": tp_local,
        "params_tp_replicated": tp_replicated,
        "params_unsharded": unsharded,
        # The parameters FSDP keeps are the fp32 master weights AdamW updates; gradients
        # come back reduce-scattered into the same sharded fp32 layout; AdamW keeps
        # exp_avg and exp_avg_sq in the parameter's dtype (foreach), or in bf16 where the
        # plan says so (plan.adam_moments, engine/optim.py AdamWBf16Moments).
        "param_bytes": param_bytes,
        "grad_bytes": param_bytes,
        "optimizer_bytes": 2 * (local * 2 if plan.adam_moments == "bf16" else param_bytes),
        "gathered_bytes": 0 if single else gathered_bytes,
        "whole_in_step_bytes": 0,
    }
    if plan.weights_kept_gathered and not single:
        # Under PP the engine keeps each stage's units gathered after forward and torch's
        # pipelining defers gradient reduction to the last microbatch (dp_sharding=
        # optimizer does the same without a pipeline): the TP-local gradients stay whole
        # all step in the reduce dtype, and the compute-dtype weights, of at most three
        # virtual stages at once under an interleaved schedule. dp_sharding=gradients
        # keeps the weights gathered and reduce-scatters every microbatch.
        held = sorted(part_gathered, reverse=True)
        if plan.layout.vp > 1:
            held = held[:GATHERED_VIRTUAL_STAGES]
        info["whole_in_step_bytes"] = sum(held)
        if plan.gradients_reduced_once:
            info["whole_in_step_bytes"] += plan.reduce_bytes * tp_local
            # No sharded gradient exists during the step: they come from the
            # reduce-scatter after its last backward and are set to None after the
            # optimizer step.
            info["grad_bytes"] = 0
    info["state_bytes"] = info["param_bytes"] + info["grad_bytes"] + info["optimizer_bytes"]
    return info


def _forget_dtensor_caches() -> None:
    """Clear DTensor's sharding and redistribution caches before a rank is built.

    They are keyed by specs whose meshes compare equal across process-group lifetimes
    (same shape, ranks and names), so after one rank's group is destroyed and the next
    rank's made, a cache hit handed back the old mesh and its collectives asked for a
    process group that no longer exists (`Could not resolve the process group registered
    under the name 81`, tracing the last rank of a TP x PP row after its rank 0)."""
    propagator = DTensor._op_dispatcher.sharding_propagator
    for cache in (getattr(propagator, "propagate_op_sharding", None),
                  getattr(_redistribute, "_gen_transform_infos", None)):
        if hasattr(cache, "cache_clear"):
            cache.cache_clear()
    for clear in (getattr(_redistribute, "clear_redistribute_planner_cache", None),
                  # The C++ dispatch fast path's own cache (torch >= 2.10).
                  getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)):
        if clear is not None:
            clear()


def build_rank(plan: Plan, rank: int):
    """Initialise a fake process group as `rank` and build its model with the engine's
    Trainer, left on the meta device. Returns the Trainer; the caller destroys the group."""
    _forget_dtensor_caches()

    dist.init_process_group("fake", rank=rank, world_size=plan.gpus, store=FakeStore())
    trainer = Trainer(plan, Path("."))  # writes nothing: only set-up code runs
    trainer.rank, trainer.world_size = rank, plan.gpus
    trainer.local_rank = rank % plan.gpus_per_node
    # Meta tensors need no device; the mesh is made for the CPU so no CUDA is touched.
    trainer.device = torch.device("cpu")
    trainer.dims = ParallelDims.from_layout(plan.layout, plan.gpus)
    trainer.dims.build_mesh("cpu")
    torch.manual_seed(plan.seed)
    trainer.build_model(materialize=False)
    return trainer


def check_rank(plan: Plan, rank: int) -> dict:
    """Build `rank` and count what it holds; an error is reported, not raised."""
    start = time.perf_counter()
    try:
        trainer = build_rank(plan, rank)
        lay = plan.layout
        pp_rank = rank_coordinates(rank, plan)["pp"]
        indices = rank_stages(pp_rank, lay.pp, lay.vp) if lay.pp > 1 else [0]
        info = count_rank(plan, rank, indices, trainer.model_parts)
        info["error"] = None
    except Exception as err:  # a rank that fails to build is the finding, not a crash
        info = {"rank": rank, **rank_coordinates(rank, plan),
                "error": f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"}
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    info["build_s"] = round(time.perf_counter() - start, 2)
    return info


def check_ranks(plan: Plan, ranks: list[int], progress=None) -> list[dict]:
    out = []
    for rank in ranks:
        out.append(check_rank(plan, rank))
        if progress is not None:
            progress(out[-1])
    return out


# Why a PP plan cannot be traced on this torch (the stand-in below needs the metadata
# protocol of torch 2.13's pipelining).
PP_UNTRACEABLE = ("pipeline parallelism is traced only with torch >= 2.13's pipelining "
                  "(its per-stage metadata exchange, which the trace answers locally)")


def _pipeline_protocol() -> bool:
    return (hasattr(schedules._PipelineSchedule, "_warmup_p2p")
            and hasattr(pipeline_stage.PipelineStage, "_recv_meta")
            and hasattr(pipeline_stage, "_StageForwardMeta"))


def _stages(schedule) -> list:
    return list(getattr(schedule, "_stages", None) or [schedule._stage])


def _track_every_microbatch(schedule, tracker) -> None:
    """Let torch's memory tracker follow a stage through all of a step's microbatches.

    The tracker keeps statistics per module and refuses a module called again from the
    top level, which it takes for the next iteration; a pipeline stage is called once
    per microbatch within one step. Only the tracker's peak is read here, so the
    stage's module statistics start again at each of its forwards."""
    for stage in _stages(schedule):
        run = stage.forward_maybe_with_nosync

        def forward(*args, run=run, module=stage.submod, **kwargs):
            tracker.memory_tracking.pop(module, None)
            return run(*args, **kwargs)
        stage.forward_maybe_with_nosync = forward


def _initialize_pipeline(trainer, inputs: torch.Tensor, labels: torch.Tensor) -> list:
    """Run the schedule's first-step set-up (metadata inference on the first microbatch,
    then a receive buffer per microbatch) before tracing, and return those buffers.

    Set up inside the tracker, the last stage's metadata inference fails: it takes input
    gradients with autograd.grad, and the tracker's hooks on a received (leaf) tensor
    cannot run there. Outside it nothing is lost: the inference is one microbatch's
    forward and backward before any buffer exists, which the traced step repeats with
    more alive; its tensors are freed after it. Any receive buffers the set-up leaves
    alive all step (torch's own PipelineStage: one per microbatch and stage, for
    activations and for gradients) are counted beside the traced peak, as the AdamW
    moments are; the engine's stages leave none (engine/parallel/pp.py,
    _ReceivingWhenNeeded): each is allocated when its receive is posted and let go after
    its microbatch's backward, inside the trace, which counts it with the rest."""
    schedule = trainer.pipeline
    mbs = trainer.plan.mbs
    positions = trainer.positions().expand(mbs, -1)
    args = (inputs[:mbs],) if trainer.has_first_stage else ()
    target = labels[:mbs] if trainer.has_last_stage else None
    initialize = getattr(schedule, "_initialize_stages", None) or schedule._initialize_stage
    # Eager, as the traced step itself runs (dynamo does not compile under the tracker's
    # dispatch mode); compiled here, inductor's kernels would run on fake tensors.
    # Inside the trainer's loss context, as its pipeline_step runs the schedule: under TP
    # the last stage's loss is vocabulary-parallel (loss_parallel), and outside it the
    # set-up's loss failed on every last rank of a TP x PP row ("mixed torch.Tensor and
    # DTensor").
    with torch.compiler.set_stance("force_eager"), trainer.loss_context():
        initialize(args, {"positions": positions}, target)
    buffers = []
    for stage in _stages(schedule):
        for infos in [*stage.args_recv_info.values(), *stage.grad_recv_info.values()]:
            buffers += [info.buffer for info in infos if info.buffer is not None]
    return buffers


def _counted_apart(tracker, buffers: list) -> None:
    """Keep the schedule's receive buffers out of the tracker: they are counted beside its
    peak, whole, for the whole step.

    The tracker files a tensor under a category the first time it sees it (a stage's
    input as an activation, a received gradient as a temporary), so each buffer used
    before the peak was counted a second time inside it: on Llama 3.1 8B cut to 8 layers
    over PP2 VP4 the step ended with all 56 of rank 0's buffers (3.5 GiB) in the tracker's
    activations and temporaries, one more 64 MiB buffer per stage forward and backward."""
    apart = {st._cdata for buffer in buffers for st in get_untyped_storages(buffer)}

    def is_buffer(t: torch.Tensor) -> bool:
        storages = get_untyped_storages(t)
        return bool(storages) and all(st._cdata in apart for st in storages)

    track, update = tracker._track, tracker._update_and_maybe_create_winfos
    tracker._track = lambda reftype, t: None if is_buffer(t) else track(reftype, t)
    tracker._update_and_maybe_create_winfos = (
        lambda t, reftype, update_existing=False:
        set() if is_buffer(t) else update(t, reftype, update_existing))


def _received_inputs_released(schedule, tracker) -> None:
    """The tracker lets each received input go when the engine's stage lets it go.

    The tracker's module hooks register torch's multi-grad hook on every module's
    inputs that require a gradient (torch.distributed._tools.mod_tracker,
    `_fw_pre_hook`). Each hook's closure keeps the autograd nodes of those inputs, and
    the hook lives in the tensor's or its node's hook dict: a cycle through autograd's
    C++ nodes that Python's collector cannot see, which keeps the chain of nodes down to
    the stage's received hidden states (a leaf: its gradient accumulator holds the
    tensor). Each received input then outlived its microbatch to the end of the step in
    the tracker's activations: 3 x 64 MiB more per microbatch traced on rank 0 of Llama
    3.1 8B over PP2 VP4, 3 x 16 of them after 16 microbatches. Without the tracker
    nothing holds it once the engine's stage lets it go after its microbatch's backward
    (pp.py `_ReceivingWhenNeeded._let_go`): the same schedule under FakeTensorMode alone,
    weak references to the 56 buffers of that rank's 16 microbatches are all dead as
    each `_let_go` returns. So its storage leaves the tracker's count there, as the
    tracker's own weak-reference callback would take it out."""
    for stage in _stages(schedule):
        let_go = getattr(stage, "_let_go", None)
        if let_go is None:  # torch's own stage: its buffers stay all step, counted apart
            continue

        def releasing(infos, let_go=let_go):
            for info in infos:
                if info.buffer is None:
                    continue
                for storage in get_untyped_storages(info.buffer):
                    # Taken out of the tracker's table, its weak reference (and callback)
                    # goes too, so the storage is never subtracted twice.
                    entry = tracker._WINFO.pop(storage, None)
                    if entry is not None:
                        tracker._delete_callback(*entry)
            let_go(infos)
        stage._let_go = releasing


@contextlib.contextmanager
def _pipeline_neighbours_standin(trainer, plan: Plan):
    """The schedule's exchanges with the neighbouring stages answered locally.

    On its first step torch's schedule votes with the other stages (a tensor read with
    .item(), which a FakeTensor cannot answer) and receives each neighbour's output and
    gradient metadata as pickled objects, which the fake process group does not carry.
    Here the vote's outcome (metadata inferred at run time, as every stage of the
    engine's pipeline votes) is set directly and each received object is the one the
    neighbour sends: its hidden states' shape (predict's stage_message_shape) in the
    compute dtype, and the gradient of the same. Checked after the step against what this rank's own stages
    send. Activations, the schedule's receive buffers and its P2P transfers are the
    real ones."""
    schedule = trainer.pipeline
    stages = _stages(schedule)
    shape = stage_message_shape(plan)
    dtype = torch.float32 if plan.dtype == "fp32" else torch.bfloat16
    hidden = _utils.extract_tensor_meta(torch.empty(shape, dtype=dtype, device="meta",
                                                    requires_grad=True))
    forward = _utils._StageForwardMeta(forward_metas=(hidden,))
    backward = _utils._StageBackwardMeta(backward_metas=_utils._derive_grad_metas((hidden,)))

    def vote(voters, has_backward, p2p_done):
        for voter in voters:
            voter._inference_mode = pipeline_stage.InferenceMode.DYNAMIC

    for stage in stages:
        index = stage.stage_index
        stage._recv_meta = lambda src, index=index: forward if src < index else backward
        stage._send_meta = lambda meta, dst: None
    schedule._warmup_p2p = vote
    yield
    for stage in stages:
        sent = stage._stage_meta.outputs
        if not stage.is_last and (tuple(sent[0].shape), sent[0].dtype) != (shape, dtype):
            raise RuntimeError(f"stage {stage.stage_index} sends {tuple(sent[0].shape)} "
                               f"{sent[0].dtype}, the trace assumed {shape} {dtype}")


def _global_peak_only(tracker) -> None:
    """Have the tracker keep only the rank's global peak, the one figure check reads.

    On every op torch's MemTracker also walks every module it has seen and updates the
    peak of each one still running: a quarter of a trace's time (the 405B's rank 0 at
    512 GPUs: 97 s with it, 72 s without, the same peak by category to the byte). The
    global update below is the one MemTracker makes; where this torch's tracker keeps its
    state under other names, its own method stays."""
    if not all(hasattr(tracker, name) for name in
               ("_curr_mem_snap", "_peak_mem", "_peak_mem_snap", "_update_peak_stats")):
        return

    def update_global_peak(peak_state) -> None:
        for device, snapshot in tracker._curr_mem_snap.items():
            if tracker._peak_mem.get(device, 0) < snapshot["Total"]:
                tracker._peak_mem[device] = snapshot["Total"]
                tracker._peak_mem_snap[device] = dict(snapshot)

    tracker._update_peak_stats = update_global_peak


@contextlib.contextmanager
def _dtensor_propagation_untracked():
    """DTensor's output-shape propagation in a fake mode of its own while tracing.

    To learn an op's output shape, DTensor runs the op once on stand-ins of the *global*
    shape (torch.distributed.tensor._sharding_prop, `_propagate_tensor_meta_non_cached`),
    inside the active fake mode if there is one, else in a new FakeTensorMode. On a GPU
    that is a new one, and torch's tracker skips those ops because their fake mode is not
    the one it was entered under. Under the trace's FakeTensorMode they ran in the trace's
    own mode, so the tracker counted the whole-tensor stand-ins as temporaries: on rank 0
    of Nemotron-4 340B's TP8 seed row, the first microbatch's embedding gradient cast to
    fp32 appeared as a [256000, 18432] bf16 input and fp32 output, 26.4 GiB a rank never
    holds (it holds [32000, 18432]). Here the propagation gets a new mode, as on a GPU."""
    detect = getattr(_sharding_prop, "detect_fake_mode", None)
    if detect is None:  # a torch whose propagation no longer looks for the active mode
        yield
        return
    _sharding_prop.detect_fake_mode = lambda *args, **kwargs: None
    try:
        yield
    finally:
        _sharding_prop.detect_fake_mode = detect


@contextlib.contextmanager
def _cp_memory_standin():
    """CP attention with a stand-in mask of the same memory while tracing (cp.py,
    MEMORY_TRACE_STANDIN: the lower-right causal bias cannot wrap a FakeTensor)."""
    cp.MEMORY_TRACE_STANDIN = True
    try:
        yield
    finally:
        cp.MEMORY_TRACE_STANDIN = False


def _trace_standins(trainer, plan: Plan, pipeline: bool) -> contextlib.ExitStack:
    """The fake mode a rank's step is traced under, with the stand-ins above: CP's mask,
    the pipeline's neighbours, DTensor's own propagation mode, the MoE layers' balanced
    routing (check/routing.py), torchao's FP8 grouped GEMM kernels
    (check/grouped_fp8.py) and the fused attention kernel of MLA's narrower value heads
    (check/fused_attention.py)."""
    with contextlib.ExitStack() as stack:  # undoes what was entered if one fails
        stack.enter_context(BalancedRoutingFakeMode(allow_non_fake_inputs=True))
        stack.enter_context(_cp_memory_standin())
        if pipeline:
            stack.enter_context(_pipeline_neighbours_standin(trainer, plan))
        stack.enter_context(_dtensor_propagation_untracked())
        stack.enter_context(balanced_routing(trainer.model_parts))
        stack.enter_context(fake_fp8_grouped_kernels())
        stack.enter_context(fused_attention_memory())
        return stack.pop_all()


def trace_problem(plan: Plan) -> str | None:
    if plan.layout.pp > 1 and not _pipeline_protocol():
        return PP_UNTRACEABLE
    if plan.one_rank_without_fsdp:
        return "a one-rank plan has no FSDP root for FSDPMemTracker"
    return None


def pipeline_trace_microbatches(plan: Plan) -> int:
    """Microbatches a pipeline rank's trace runs: 4 x PP, or the step's if fewer.

    A rank's peak comes once its schedule is in its steady state, with its warm-up's
    forwards in flight (1F1B: PP - rank; interleaved: (PP - rank - 1) x 2 + (VP - 1) x PP
    stage forwards) and every virtual stage's gradients allocated; later microbatches
    repeat it. Measured on Llama 3.1 8B cut to 8 layers over PP2 VP4
    (tests/test_check.py): 2 x PP and 4 x PP microbatches both reach the peak of all 16
    of the step's to within 1 MiB. Receive buffers kept all step, where a stage keeps them
    (torch's own PipelineStage, not the engine's), are scaled to the step's count
    (trace_rank)."""
    return min(plan.ga, 4 * plan.layout.pp)


def _trace_batches(trainer, microbatches: int, pipeline: bool) -> list:
    """Real (small) batches: the synthetic data generator reads numbers back, which a
    fake tensor cannot; fake mode takes them as inputs. A pipeline's schedule runs all of
    the step's microbatches in one call."""
    if pipeline:
        return trainer.timed_step_inputs(0)
    batches = [trainer.context_shard(i, t) for i, t in trainer.step_batches(0)]
    return batches[:microbatches]


def _trace_result(rank: int, tracker, info: dict, buffers: list, traced_plan: Plan,
                  step_microbatches: int, traced_batches: int, pipeline: bool) -> dict:
    """The traced rank's peak: the tracker's forward/backward peak by category, plus the
    optimizer's moments the build counted and the pipeline's receive buffers."""
    snapshot = tracker.get_tracker_snapshot("peak")
    (device_snapshot,) = snapshot.values()
    parts = {str(getattr(k, "value", k)): int(v) for k, v in device_snapshot.items()}
    total = parts.pop("Total")
    # Buffers the set-up left alive all step, one per microbatch and stage (none with
    # the engine's stages): the step's are the traced ones scaled.
    buffer_bytes = (sum(b.numel() * b.element_size() for b in buffers)
                    * step_microbatches // traced_plan.ga)
    out = {"rank": rank, "error": None,
           "microbatches": traced_plan.ga if pipeline else traced_batches,
           "step_microbatches": step_microbatches,
           "categories": {k: v for k, v in parts.items() if v},
           "forward_backward_peak_bytes": total,
           "optimizer_bytes": info["optimizer_bytes"],
           "pipeline_buffer_bytes": buffer_bytes,
           "peak_bytes": total + info["optimizer_bytes"] + buffer_bytes}
    return out


def trace_rank(plan: Plan, rank: int, microbatches: int = 2,
               pipeline_microbatches: int | None = None) -> dict:
    """Forward and backward of the rank's first microbatches under FakeTensorMode with
    torch's FSDPMemTracker: the peak bytes of live tensors, by category.

    Two microbatches reach the steady peak of a step without a pipeline: every later
    one repeats the second (FSDP gathers, frees and reduces the same units; the sharded
    gradients already exist). Under dp_sharding=optimizer the first accumulates whole
    gradients and the second, the step's last, reduce-scatters them. A pipeline rank
    runs `pipeline_microbatches` (default pipeline_trace_microbatches) through its
    schedule. The optimizer step is not traced: under FakeTensorMode the engine's
    foreach AdamW shows 13-27 times the two fp32 moments alive inside the step
    (Llama 3.1 8B and Nemotron-4 15B cut to 4 layers), while foreach=False shows none of
    that and after the step the tracker holds exactly the two moments: an artefact of the
    foreach kernels under fake tensors, not memory a GPU would hold. So the moments the
    build counted (2 x the fp32 master bytes, alive across steps) are added to the traced
    forward/backward peak instead.
    """
    problem = trace_problem(plan)
    if problem:
        return {"rank": rank, "error": problem}
    start = time.perf_counter()
    lay = plan.layout
    step_microbatches = plan.ga
    traced_plan = plan
    if lay.pp > 1 and plan.gpus > 1:
        count = pipeline_microbatches or pipeline_trace_microbatches(plan)
        traced_plan = replace(plan, gbs=count * plan.mbs * lay.dp)
    try:
        trainer = build_rank(traced_plan, rank)
        indices = (rank_stages(rank_coordinates(rank, plan)["pp"], lay.pp, lay.vp)
                   if lay.pp > 1 else [0])
        info = count_rank(plan, rank, indices, trainer.model_parts)
        pipeline = trainer.pipeline is not None
        batches = _trace_batches(trainer, microbatches, pipeline)
        trainer.positions()
        with _trace_standins(trainer, plan, pipeline):
            for part in trainer.model_parts:
                part.to_empty(device="cpu")
            buffers = _initialize_pipeline(trainer, *batches[0]) if pipeline else []
            optimizer = build_optimizer(trainer.model, plan.lr, moments=plan.adam_moments)
            tracker = FSDPMemTracker(trainer.model_parts[0], optimizer)
            # torch's tracker takes one FSDP root; a rank's pipeline stages are several
            # (trainer.model holds them all), each an FSDP root of its own.
            tracker._root_mod = trainer.model
            _global_peak_only(tracker)
            if pipeline:
                _track_every_microbatch(trainer.pipeline, tracker)
                _counted_apart(tracker, buffers)
                _received_inputs_released(trainer.pipeline, tracker)
            with tracker:
                for index, (inputs, labels) in enumerate(batches):
                    if pipeline:
                        trainer.pipeline_step(inputs, labels)
                    else:
                        trainer.before_microbatch(last=index == len(batches) - 1)
                        trainer.forward_backward_step(inputs, labels)
                    # Module-wise stats cover one forward each; the peak is kept.
                    tracker.reset_mod_stats()
        out = _trace_result(rank, tracker, info, buffers, traced_plan, step_microbatches,
                            len(batches), pipeline)
    except Exception as err:  # an op without a fake kernel is the finding
        text = str(err).strip().splitlines()
        out = {"rank": rank, "error": f"{type(err).__name__}: {text[0] if text else ''}"}
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    out["trace_s"] = round(time.perf_counter() - start, 1)
    return out
