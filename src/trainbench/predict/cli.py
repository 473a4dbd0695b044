"""`trainbench predict`: step time, throughput and memory before launching; --search for
the best layouts; --calibrate to fit the model to a cluster's measured runs.

Importing this module imports nothing heavy: the command body imports what it uses.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from ..catalog import hardware
from ..catalog.models import get_model
from ..config import load_config, save_config
from ..console import console, fail
from ..default_dtype import default_dtype_for
from ..overrides import CHOICE_KEYS, parse_overrides
from ..plan import PlanError
from ..planning import build_plan
from .calibrate import CalibrationError, find_runs, fit, store
from .constants import calibrated_values
from .context import ENGINE, MOE_DISPATCHERS, SHARDINGS, MegatronRun
from .hardware_profile import (HardwareProfileError, device_and_constants, predict_with_profile,
                               read_facts)
from .memory import verdict
from .report import calibration_dict, part_label, prediction_dict, search_dict
from .search import search

FORMATS = ("table", "json")
LOSSES = ("unfused", "te")


def predict(
    workload: Optional[str] = typer.Option(None, "-w", "--workload",
                                           help="Workload key, e.g. pretrain_llama3.1."),
    size: Optional[str] = typer.Option(None, "-s", "--size", envvar="MODEL_SIZE",
                                       help="Model size, e.g. 70b."),
    dtype: Optional[str] = typer.Option(None, "--dtype", envvar="DTYPE",
                                        help="bf16, fp8 or fp32; default as `run`: bf16 "
                                             "on a GPU, on a CPU bf16 only where it is "
                                             "native."),
    scale: Optional[int] = typer.Option(None, "--scale", envvar="JOB_TOTAL_GPUS",
                                        help="Number of GPUs."),
    gpu: str = typer.Option("h100", "--gpu", help="GPU type to predict for."),
    sets: Optional[List[str]] = typer.Option(
        None, "--set", help="Override plan fields, e.g. --set tp=2 --set 'pp=4 vp=5'."),
    fmt: str = typer.Option("table", "--format", help="table or json."),
    do_search: bool = typer.Option(False, "--search",
                                   help="Rank the layouts that fit by predicted step time."),
    top: int = typer.Option(10, "--top", help="Layouts --search lists."),
    headroom: float = typer.Option(0.05, "--headroom",
                                   help="Share of usable memory --search keeps spare."),
    calibrate_dir: Optional[Path] = typer.Option(
        None, "--calibrate", help="Fit the model to the experiment directories under DIR "
                                  "and store the constants in the cluster config."),
    hardware: Optional[Path] = typer.Option(
        None, "--hardware", metavar="PROFILE",
        help="A hardware-profile.json from `trainbench probe`: predict with its measured "
             "GEMM TFLOPS and collective bandwidths instead of catalog assumptions."),
    sharding: str = typer.Option(
        "engine", "--sharding",
        help="How DP shards model state: engine (default; what `trainbench run` runs: "
             "FSDP2 over dp x cp, the figure run prints too), recipe (what the published "
             "run used: Megatron's distributed optimizer for the NeMo seeds, FSDP for "
             "MaxText's Llama 2), distributed_optimizer or fsdp. Megatron's "
             "(distributed_optimizer, and recipe for the NeMo recipes) also sends an MoE "
             "token once per remote node, as its DeepEP / HybridEP dispatch does."),
    loss: str = typer.Option(
        "unfused", "--loss",
        help="A Megatron-LM run's loss (with --sharding recipe, distributed_optimizer "
             "or fsdp): unfused (default; Megatron's vocabulary-parallel cross entropy, "
             "as the seeds ran) or te (Transformer Engine's fused cross entropy, as "
             "NVIDIA's recipes from Megatron-Bridge 25.09 and NeMo 25.07 run)."),
    offload_layers: int = typer.Option(
        0, "--offload-layers", metavar="N",
        help="Layers whose activations a Megatron-LM run keeps in host memory "
             "(its cpu_offloading_num_layers; PP1 only; NVIDIA's FSDP recipes on "
             "GB200 / GB300 set it). Memory only: the transfers are not charged."),
    moe_dispatcher: str = typer.Option(
        "flex", "--moe-dispatcher",
        help="How a Megatron-LM MoE run dispatches its tokens (with --sharding recipe or "
             "distributed_optimizer): flex (default; DeepEP / HybridEP, a token sent once "
             "per remote node) or alltoall (Megatron-Core's alltoall dispatcher, a row per "
             "chosen expert, as Megatron-Bridge's Qwen3 235B-A22B H100 rows ran)."),
):
    """Predict step time, tokens/s, MFU and memory per GPU before launching."""
    _check_choices(fmt, sharding, loss, moe_dispatcher)
    megatron = MegatronRun(fused_loss=loss == "te", offload_layers=offload_layers,
                           moe_dispatcher=moe_dispatcher)
    try:
        config = load_config()
    except ValueError as err:
        fail(str(err))
    if calibrate_dir is not None:
        _check_calibrate_alone(hardware, megatron)
        if do_search:
            fail("--calibrate and --search are separate runs; drop one of them")
        _calibrate(calibrate_dir, config, fmt, sharding)
        return
    _check_prediction_options(workload, size, scale, top, headroom)
    if dtype is None:
        dtype, why = default_dtype_for(workload, size, gpu)
        if fmt == "table":
            typer.echo(f"dtype: {dtype} ({why})")
    overrides, facts = _overrides(sets), _hardware_facts(hardware)
    if do_search:
        _search(workload, size, dtype, scale, gpu, overrides, config, sharding, top,
                headroom, fmt, facts, megatron)
    else:
        _predict(workload, size, dtype, scale, gpu, overrides, config, sharding, fmt,
                 facts, megatron)


def register(app) -> None:
    """Add `trainbench predict` to the Typer app."""
    app.command("predict")(predict)


def _calibrated(config: dict, gpu: str) -> bool:
    return bool(calibrated_values(config, gpu))


def _check_choices(fmt: str, sharding: str, loss: str, moe_dispatcher: str) -> None:
    if fmt not in FORMATS:
        fail(f"unknown --format {fmt!r}; use table or json")
    if sharding not in SHARDINGS:
        fail(f"unknown --sharding {sharding!r}; use one of {', '.join(SHARDINGS)}")
    if loss not in LOSSES:
        fail(f"unknown --loss {loss!r}; use {' or '.join(LOSSES)}")
    if moe_dispatcher not in MOE_DISPATCHERS:
        fail(f"unknown --moe-dispatcher {moe_dispatcher!r}; use {' or '.join(MOE_DISPATCHERS)}")


def _check_calibrate_alone(hardware, megatron) -> None:
    """--calibrate fits to the runs under a directory as they ran: options that describe
    one run to predict do not go with it."""
    if hardware is not None:
        fail("--hardware and --calibrate are separate runs: --calibrate fits to measured "
             "step times, --hardware predicts from measured GEMMs and links; drop one")
    if not megatron.default:
        fail("--loss and --offload-layers describe one run to predict; --calibrate fits "
             "to the runs under DIR as they ran: drop them")


def _check_prediction_options(workload, size, scale, top: int, headroom: float) -> None:
    missing = [name for name, value in (("-w/--workload", workload), ("-s/--size", size),
                                        ("--scale", scale))
               if value is None]
    if missing:
        fail(f"predict needs {', '.join(missing)} (or --calibrate DIR)")
    if scale < 1:
        fail("--scale must be at least 1")
    if top < 1:
        fail("--top must be at least 1")
    if not 0 <= headroom < 1:
        fail("--headroom must be a fraction in [0, 1)")


def _overrides(sets: list[str] | None) -> dict:
    try:
        return parse_overrides(sets or [])
    except PlanError as err:
        fail("; ".join(err.problems))


def _hardware_facts(hardware: Path | None):
    """The measured facts of a `trainbench probe` profile, or None without --hardware."""
    if hardware is None:
        return None
    try:
        return read_facts(hardware)  # a bad file fails first, alone
    except HardwareProfileError as err:
        fail(str(err))


def _predict(workload, size, dtype, scale, gpu, overrides, config, sharding, fmt,
             facts, megatron) -> None:
    try:
        plan = build_plan(workload, size, dtype, scale, gpu, overrides=dict(overrides))
    except PlanError as err:
        fail("; ".join(err.problems))
    try:
        pred, figures = predict_with_profile(plan, facts, sharding=sharding, config=config,
                                             megatron=megatron)
    except (LookupError, ValueError) as err:
        fail(str(err))
    data = prediction_dict(plan, pred, overrides=overrides,
                           calibrated=_calibrated(config, plan.gpu_type), figures=figures,
                           profile=None if facts is None else facts.path)
    if sharding != "engine":
        data["megatron_run"] = {"fused_loss": megatron.fused_loss,
                                "offload_layers": megatron.offload_layers,
                                "moe_dispatcher": megatron.moe_dispatcher}
    if "dp_sharding" not in overrides:
        data["dp_sharding_alternatives"] = _sharding_alternatives(plan, facts, sharding, config)
    if fmt == "json":
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    _print_prediction(plan, data, pred)


def _sharding_alternatives(plan, facts, sharding: str, config) -> list[dict]:
    """The same plan under the engine's other data-parallel shardings (none where the
    choice changes nothing: under PP, without data or context parallel ranks, or for
    the recipe's own framework), so a reader sees what gathering less often would buy."""
    lay = plan.layout
    if sharding != ENGINE or lay.pp > 1 or lay.dp * lay.cp == 1 or plan.gpus == 1:
        return []
    out = []
    for choice in CHOICE_KEYS["dp_sharding"]:
        if choice == plan.dp_sharding:
            continue
        other, _ = predict_with_profile(replace(plan, dp_sharding=choice), facts,
                                        sharding=sharding, config=config)
        out.append({"dp_sharding": choice, "step_time_s": other.step_time_s,
                    "memory_gib": other.memory.total_gib, "fits": other.memory.fits})
    return out


def _print_prediction(plan, data: dict, pred) -> None:
    out = console()
    lay = data["layout"]
    title = (f"{plan.workload} {plan.size} {plan.dtype} on {plan.gpus} x "
             f"{hardware.GPUS[plan.gpu_type].name}: {plan.layout.describe()} MBS{lay['mbs']} "
             f"GBS{lay['gbs']} GA{lay['ga']}"
             + (f" recompute={lay['recompute']}" if lay["recompute"] != "none" else ""))
    summary = Table(title=title, show_header=False)
    summary.add_column("metric")
    summary.add_column("value", justify="right")
    step = f"{data['step_time_s']:.3f} s"
    if "published_step_time_s" in data:
        step += (f"  (published {data['published_step_time_s']:g} s, "
                 f"{100 * data['error_vs_published']:+.1f}%)")
    summary.add_row("step time", step)
    summary.add_row("tokens/s", f"{data['tokens_per_s']:,.0f}")
    summary.add_row("TFLOPS/GPU (published FLOPs)", f"{data['tflops_per_gpu']:.1f}")
    for key, label in (("mfu", "MFU (published FLOPs)"), ("mfu_causal", "MFU (causal FLOPs)")):
        # An impossible MFU (metrics.mfu_problem) is shown as INVALID with its reason.
        summary.add_row(label, f"{100 * data[key]:.2f}%" if data[key] is not None
                        else data[f"{key}_problem"])
    summary.add_row("days per 1T tokens", f"{data['days_per_1t_tokens']:.2f}")
    # The same words `trainbench run` prints for this plan (memory.check_memory).
    summary.add_row("peak memory per GPU", verdict(pred.memory, plan.gpu_type))
    summary.add_row("memory assumes", data["sharding_assumption"])
    for alt in data.get("dp_sharding_alternatives", []):
        fits = {True: "fits", False: "does not fit", None: "capacity unknown"}[alt["fits"]]
        summary.add_row(f"  with --set dp_sharding={alt['dp_sharding']}",
                        f"{alt['step_time_s']:.3f} s, {alt['memory_gib']:.1f} GiB: {fits}")
    summary.add_row("constants", data["constants_source"])
    for name, where in data["hardware_figures"].items():
        summary.add_row(f"  {name.replace('_', ' ')}", where)
    out.print(summary)

    parts = Table(title="Where the step goes (critical pipeline rank "
                        f"{data['critical_pipeline_rank']})")
    for col in ("part", "seconds", "share"):
        parts.add_column(col, justify="right" if col != "part" else "left")
    for part, v in data["breakdown"].items():
        parts.add_row(part_label(part), f"{v['seconds']:.3f}", f"{100 * v['share']:.1f}%")
    for part, secs in data["compute_breakdown_s"].items():
        if secs > 0:
            parts.add_row(f"  compute: {part.replace('_', ' ')}", f"{secs:.3f}",
                          f"{100 * secs / data['step_time_s']:.1f}%")
    out.print(parts)

    mem = Table(title=f"Memory per GPU, pipeline rank {data['memory_rank']}")
    mem.add_column("part")
    mem.add_column("GiB", justify="right")
    for part, gib in data["memory_breakdown_gib"].items():
        note = (f" ({data['in_flight_microbatch_chunks']} microbatch-chunks in flight)"
                if part == "activations" else "")
        mem.add_row(part + note, f"{gib:.2f}")
    mem.add_row("total", f"{data['memory_gib']:.2f}")
    out.print(mem)


def _search(workload, size, dtype, scale, gpu, overrides, config, sharding, top, headroom,
            fmt, facts, megatron) -> None:
    try:
        get_model(workload, size)
        device = constants = None
        if facts is not None:
            device, constants = device_and_constants(gpu.lower(), None, facts, config)
        result = search(workload, size, dtype.lower(), scale, gpu.lower(), overrides=overrides,
                        config=config, sharding=sharding, headroom=headroom, device=device,
                        constants=constants, megatron=megatron)
    except (LookupError, ValueError) as err:
        fail(str(err))
    data = search_dict(result, top)
    if fmt == "json":
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    if not data["top"]:
        fail(f"no layout of {workload} {size} {dtype} fits {scale} x {gpu} "
             f"({result.considered} considered, {result.not_fitting} do not fit, "
             f"{result.tight} within the {100 * headroom:.0f}% headroom, "
             f"{result.invalid} invalid); try more GPUs or --set recompute=full", code=1)
    table = Table(title=f"Fastest layouts of {workload} {size} {dtype} on {scale} x {gpu} "
                        "(predicted; global batch fixed)")
    for col in ("#", "layout", "step (s)", "tokens/s", "MFU", "why"):
        table.add_column(col, justify="right" if col in ("#", "step (s)", "tokens/s", "MFU")
                         else "left")
    for c in data["top"]:
        table.add_row(str(c["rank"]), c["describe"], f"{c['step_time_s']:.3f}",
                      f"{c['tokens_per_s']:,.0f}",
                      "INVALID" if c["mfu"] is None else f"{100 * c['mfu']:.1f}%", c["why"])
    out = console()
    out.print(table)
    lines = [f"{data['considered']} layouts considered: {data['invalid']} invalid, "
             f"{data['not_fitting']} do not fit, {data['within_headroom']} fit by less than "
             f"{100 * headroom:.0f}% headroom; {data['layouts']} layouts ranked "
             "(each with its best VP, recompute and sharding choice)."]
    if data["recipe_layout"] is not None:
        rank = data["recipe_layout_rank"]
        rl = data["recipe_layout"]
        desc = f"TP{rl['tp']} PP{rl['pp']} CP{rl['cp']} VP{rl['vp']} MBS{rl['mbs']}"
        lines.append(f"The recipe's layout ({desc}) ranks "
                     + (f"#{rank}." if rank else "outside the list (dropped or not its best VP)."))
    invalid = [c for c in data["top"] if c["mfu"] is None]
    if invalid:
        lines.append(f"{len(invalid)} layout(s): {invalid[0]['mfu_problem']}")
    for line in lines:
        out.print(line)


def _calibrate(directory: Path, config: dict, fmt: str, sharding: str) -> None:
    if not directory.is_dir():
        fail(f"--calibrate {directory}: not a directory; pass the folder holding the "
             "experiment directories (plan.json + metrics.jsonl)")
    runs, skipped = find_runs(directory)
    usable = [r for r in runs if r.plan.gpu_type in hardware.GPUS]
    ignored = len(runs) - len(usable)
    if not usable:
        fail(f"no measured GPU runs under {directory} (experiment directories with plan.json "
             f"and metrics.jsonl on a known GPU type; {len(skipped)} skipped, {ignored} on "
             "CPU or an unknown device)")
    # Measured runs come from trainbench's engine, which shards with FSDP2.
    run_sharding = "engine" if sharding == "recipe" else sharding
    results = []
    new_config = dict(config)
    try:
        for gpu_type in sorted({r.plan.gpu_type for r in usable}):
            result = fit(usable, gpu_type, config=config, sharding=run_sharding)
            results.append(result)
            new_config = store(new_config, result)
    except (CalibrationError, LookupError, ValueError) as err:
        fail(str(err))
    try:
        path = save_config(new_config)
    except ValueError as err:
        fail(str(err))
    data = {"config": str(path), "skipped": skipped, "ignored_runs": ignored,
            "calibrations": [calibration_dict(r) for r in results]}
    if fmt == "json":
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    out = console()
    table = Table(title=f"Calibration from {directory}")
    for col in ("GPU", "runs", "mean |error| before", "after", "max |error| before", "after",
                "fitted constants"):
        table.add_column(col)
    for r in results:
        table.add_row(r.gpu_type, str(len(r.runs)), f"{r.mean_abs_before_pct:.1f}%",
                      f"{r.mean_abs_after_pct:.1f}%", f"{r.max_abs_before_pct:.1f}%",
                      f"{r.max_abs_after_pct:.1f}%",
                      ", ".join(f"{k}={v:.4g}" for k, v in r.fitted.items()) or "(unchanged)")
    out.print(table)
    out.print(f"stored under 'calibration' in {path}"
              + (f"; {len(skipped)} directories skipped" if skipped else "")
              + (f"; {ignored} runs on CPU or unknown devices ignored" if ignored else ""))
