"""What a run records about itself as it starts: the peak its MFU divides by, the layout
and kernels that really run, the overlap settings, and the first log lines. Rank 0
writes it to run.json once (Trainer.write_run_info); results and compare read it."""

from __future__ import annotations

import socket
import time

import torch
import torch.distributed as dist

from ..conditions import allocator_setting
from ..layout import stage_layers
from ..plan import FP8_DTYPES, Plan, dp_sharding_label, pipeline_layers
from .optim import describe as describe_optimizer
from .parallel import compile_description
from .parallel.mesh import ParallelDims
from .parallel.pp import schedule_name
from .peak import resolve_peak

CPU_FP8_NO_MFU = ("MFU not applicable: FP8 on a CPU is an emulation (FP8 GEMMs in "
                  "software) run for correctness, not a performance figure")


def run_peak(plan: Plan, device: torch.device, compute_dtype: torch.dtype) -> dict:
    """The peak an MFU divides by, where it comes from, the device's name, the GEMM that
    measured a CPU's peak, and why MFU does not apply (None where it does)."""
    if plan.dtype in FP8_DTYPES and device.type == "cpu":
        # No CPU has FP8 arithmetic: torch._scaled_mm emulates it, so a CPU FP8 run
        # checks numerics and its speed measures nothing an MFU could compare.
        return {"peak_tflops": None, "peak_source": "not applicable", "device_name": "CPU",
                "peak_gemm": None, "mfu_not_applicable": CPU_FP8_NO_MFU}
    autocast = plan.one_rank_without_fsdp and compute_dtype != torch.float32
    peak, source, name, gemm = resolve_peak(plan, compute_dtype, autocast=autocast)
    return {"peak_tflops": peak, "peak_source": source, "device_name": name,
            "peak_gemm": gemm, "mfu_not_applicable": None}


def parallel_summary(plan: Plan) -> dict:
    """The layout this run really uses."""
    lay = plan.layout
    summary = {"tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "dp": lay.dp, "vp": lay.vp,
               "sequence_parallel": lay.tp > 1, "loss_parallel": lay.tp > 1,
               # FSDP shards over dp x cp; a one-rank run has nothing to shard.
               "fsdp_shards": 0 if plan.one_rank_without_fsdp else lay.dp * lay.cp,
               "microbatches_per_step": plan.ga}
    if lay.pp > 1:
        summary["pipeline_schedule"] = schedule_name(plan)
        summary["stage_layers"] = stage_layers(pipeline_layers(plan.model), lay.pp, lay.vp,
                                               lay.pp_split)
        if lay.pp_split:
            summary["pp_split"] = lay.pp_split
    if lay.cp > 1:
        summary["context_parallel"] = "all-gather KV, head-tail load balance"
    return summary


def overlap_info(plan: Plan, model_parts: list, dims: ParallelDims) -> dict:
    """The communication-overlap settings that ran (absent: no FSDP / TP / CP)."""
    out = {}
    fsdp = getattr(model_parts[0], "fsdp_settings", None)
    if fsdp is not None:
        out["fsdp"] = {**fsdp, "dp_sharding": plan.dp_sharding,
                       "dp_sharding_chosen_by": plan.dp_sharding_source,
                       "dp_sharding_label": dp_sharding_label(plan),
                       "gradients_reduced": "once a step"
                       if plan.gradients_reduced_once else "every microbatch"}
    if dims.tp_enabled:
        out["async_tp"] = plan.async_tp
    if dims.cp_enabled:
        out["cp_impl"] = plan.cp_impl
    return out


def run_info(trainer) -> dict:
    """run.json's opening record for a Trainer that has finished its set-up."""
    plan, peak = trainer.plan, trainer.peak
    info = {
        "device_name": peak["device_name"],
        "peak_tflops": peak["peak_tflops"],
        "peak_source": peak["peak_source"],
        "peak_gemm": peak["peak_gemm"],  # the GEMM whose rate is a CPU's measured peak
        "world_size": trainer.world_size,
        "layout": plan.layout.describe(),
        "parallel": parallel_summary(plan),
        "backend": dist.get_backend(),
        "torch_version": torch.__version__,
        "hostname": socket.gethostname(),
        "start_time": time.time(),
        "flops_per_sequence": trainer.flops_per_seq,
        "flops_convention": "published",
        "optimizer": describe_optimizer(trainer.optimizer),
        "sdpa_backend": trainer.sdpa_backend,
        "loss": trainer.loss_kind,
        "compile": compile_description(plan),
        # Profiled or traced timings are not valid for performance comparison.
        "profiled": bool(plan.features.profile),
        "nccl_traced": bool(plan.features.nccl_trace),
    }
    if trainer.ssd_scan is not None:  # the Mamba-2 scan a hybrid model ran
        info["ssd_scan"] = trainer.ssd_scan
    if trainer.fp8_info is not None:  # the recipe that ran, the layers kept in bf16
        info["fp8"] = trainer.fp8_info
    info.update(overlap_info(plan, trainer.model_parts, trainer.dims))
    if peak["mfu_not_applicable"]:
        info["mfu_not_applicable"] = peak["mfu_not_applicable"]
    info["conditions"] = trainer.conditions
    return info


def startup_lines(trainer) -> list[str]:
    """The log's opening lines: what runs, on what, with which settings."""
    plan, fp8 = trainer.plan, trainer.fp8_info
    lines = [f"trainbench: {plan.name} on {trainer.world_size} x "
             f"{trainer.peak['device_name']}, layout {plan.layout.describe()} MBS {plan.mbs} "
             f"GBS {plan.gbs} GA {plan.ga}, {plan.dtype}, {plan.steps} steps",
             f"trainbench: compile {compile_description(plan)}"]
    if plan.device == "cuda":  # the launcher's default or the user's (launch/rank_env.py)
        lines.append(f"trainbench: CUDA allocator {allocator_setting()}")
    if trainer.world_size > 1:
        lines.append(f"trainbench: data-parallel sharding {dp_sharding_label(plan)}")
    if plan.adam_moments == "bf16":
        lines.append(f"trainbench: AdamW moments bf16, master weights {plan.master_weights}"
                     + (" (the only copy, as Apex's bf16-state Adam keeps them)"
                        if plan.master_weights == "bf16" else ""))
    if fp8 is not None:
        lines.append(f"trainbench: fp8 recipe {fp8['recipe']}, {fp8['float8_linears']} FP8 "
                     f"linears, FSDP float8 all-gather "
                     f"{'on' if fp8['fsdp_float8_all_gather'] else 'off'}")
    if trainer.peak["mfu_not_applicable"]:
        lines.append(f"trainbench: {trainer.peak['mfu_not_applicable']}")
    return lines
