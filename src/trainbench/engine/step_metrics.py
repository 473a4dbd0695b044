"""A step's record: the loss averaged over the data-parallel ranks, the slowest rank's
step time, throughput and memory. Its collectives and host reads come after the step's
timing sync, so they are never part of the time they report."""

from __future__ import annotations

import os
import resource
import time

import torch
import torch.distributed as dist

from ..plan import Plan
from .log import StepMetrics
from .parallel.mesh import ParallelDims


def reduce_step_metrics(plan: Plan, dims: ParallelDims, device: torch.device,
                        flops_per_seq: float, step: int, total_steps: int, lr: float,
                        local_loss: torch.Tensor, grad_norm: torch.Tensor,
                        elapsed: float) -> StepMetrics:
    """Reduce the loss over data-parallel ranks and the step time (max) over all."""
    loss = local_loss.clone()
    if dims.pp_enabled:  # only the last stage computed a loss; the rest hold 0
        dist.all_reduce(loss, op=dist.ReduceOp.SUM, group=dims["pp"].get_group())
    on_gpu = device.type == "cuda"
    dist.all_reduce(loss, op=dist.ReduceOp.AVG if on_gpu else dist.ReduceOp.SUM,
                    group=dims["dp_cp"].get_group())
    if not on_gpu:  # gloo has no AVG
        loss /= dims["dp_cp"].size()
    slowest = torch.tensor([elapsed], device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    step_time = float(slowest)
    if on_gpu:
        peak_mem = torch.cuda.max_memory_reserved(device)
        peak_alloc = torch.cuda.max_memory_allocated(device)
        alloc = torch.cuda.memory_allocated(device)
    else:
        peak_mem = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        peak_alloc = None
        alloc = _rss_bytes()
    world = dist.get_world_size()
    return StepMetrics(
        iteration=step, total_iterations=total_steps, lr=lr, global_batch_size=plan.gbs,
        loss=float(loss), grad_norm=float(grad_norm), step_time_s=step_time,
        tflops_per_gpu=plan.gbs * flops_per_seq / step_time / world / 1e12,
        tokens_per_s=plan.seq_len * plan.gbs / step_time, peak_memory_bytes=int(peak_mem),
        memory_allocated_bytes=int(alloc), consumed_samples=(step + 1) * plan.gbs,
        time=time.time(), peak_allocated_bytes=peak_alloc)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
