"""Pipeline parallelism with `torch.distributed.pipelining`.

The model built on the meta device is cut into stage modules by deleting what a stage
does not own: other stages' layers (the ModuleDict keeps global indices, so parameter
names stay those of the full model), the embedding except on the first stage, the
final norm and output head except on the last. The layer split is NeMo's
(layout.stage_layers), including its uneven split where the embedding and the loss
each count as one layer.

With VP virtual stages per rank, rank p runs stages p, p + PP, ... (interleaved 1F1B,
Megatron's order); with VP = 1 it runs stage p under 1F1B. The schedule splits each
data-parallel rank's batch of GBS/DP sequences into GA = GBS/(MBS*DP) microbatches of
MBS and averages the microbatch losses (gradients scaled by 1/GA), exactly as
gradient accumulation without a pipeline.
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from ...layout import rank_stages, stage_layers
from ...plan import Plan, pipeline_layers


def split_into_stages(model: nn.Module, plan: Plan, pp_rank: int) -> list[tuple[int, nn.Module]]:
    """(stage index, stage module) for each virtual stage this pipeline rank runs.

    `model` is the full model on the meta device (copying it costs no memory).
    """
    lay = plan.layout
    split = stage_layers(pipeline_layers(plan.model), lay.pp, lay.vp, lay.pp_split)
    last = lay.pp * lay.vp - 1
    stages = []
    for index in rank_stages(pp_rank, lay.pp, lay.vp):
        owned = {str(i) for i in split[index]}
        # Layers the stage does not own are never copied (the memo maps them to None,
        # then they are dropped): a 340B rank with 12 virtual stages would otherwise copy
        # the whole meta model 12 times.
        memo = {id(layer): None for key, layer in model.layers.items() if key not in owned}
        part = copy.deepcopy(model, memo)
        for key in list(part.layers.keys()):
            if key not in owned:
                del part.layers[key]
        if index != 0:
            part.tok_embeddings = None
        if index != last:
            part.norm = None
            part.output = None
        stages.append((index, part))
    return stages


def _keeping_moe_state(infer):
    """Wrap a stage's metadata inference so it leaves the MoE layers' balancing state
    (DeepSeek-V3's expert bias and the load that moves it) as it found it.

    torch 2.13 (the release here) infers a stage's input and output metadata by running
    the stage once more, forward and backward, in training mode on the first
    microbatch (on the first stage) or on uninitialised buffers (later stages). Counted
    as load, that extra forward skews the step's load that moves the selection bias:
    measured on tiny DeepSeek-V3 PP2 VP2, the step-1 gradient norm then differed from
    one process by 1.3e-5. Older releases infer on the meta device under no_grad
    (`_shape_inference`), which counts nothing.
    """
    import functools

    from ..models.moe import moe_layers

    @functools.wraps(infer)
    def keeping(self, *args, **kwargs):
        saved = [(m, m.expert_bias.clone(), m.expert_load.clone())
                 for m in moe_layers(self.submod)]
        try:
            return infer(self, *args, **kwargs)
        finally:
            with torch.no_grad():
                for moe, bias, load in saved:
                    moe.expert_bias.copy_(bias)
                    moe.expert_load.copy_(load)
    return keeping


def _stage_class():
    """PipelineStage, its metadata inference wrapped by _keeping_moe_state (the method
    is `_forward_metadata_inference` in torch 2.13, `_shape_inference` in older
    releases)."""
    from torch.distributed.pipelining import PipelineStage

    overrides = {name: _keeping_moe_state(getattr(PipelineStage, name))
                 for name in ("_forward_metadata_inference", "_shape_inference")
                 if hasattr(PipelineStage, name)}
    return type("MoEStatePreservingStage", (PipelineStage,), overrides)


def build_schedule(stage_modules: list[tuple[int, nn.Module]], plan: Plan, pp_mesh: DeviceMesh,
                   device: torch.device, loss_fn: Callable):
    """The pipeline schedule that runs this rank's stages: 1F1B, or interleaved 1F1B."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleInterleaved1F1B

    lay = plan.layout
    num_stages = lay.pp * lay.vp
    group = pp_mesh.get_group()
    stage_class = _stage_class()
    stages = [stage_class(module, index, num_stages, device, group=group)
              for index, module in stage_modules]
    # scale_grads: each microbatch's loss is a mean, so the summed gradients are divided
    # by the number of microbatches, as gradient accumulation does.
    if lay.vp == 1:
        return Schedule1F1B(stages[0], n_microbatches=plan.ga, loss_fn=loss_fn,
                            scale_grads=True)
    return ScheduleInterleaved1F1B(stages, n_microbatches=plan.ga, loss_fn=loss_fn,
                                   scale_grads=True)


def schedule_name(plan: Plan) -> str:
    """The schedule `build_schedule` picks for this plan ('' without a pipeline)."""
    if plan.layout.pp == 1:
        return ""
    return "1F1B" if plan.layout.vp == 1 else "Interleaved1F1B"
