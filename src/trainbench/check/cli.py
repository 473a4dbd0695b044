"""`trainbench check`: build chosen ranks of a plan at its real size, without GPUs.

Importing this module imports no torch: the command body imports check.build.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import List, Optional

import typer
from rich.table import Table

from ..config import load_config
from ..console import console, fail
from ..default_dtype import default_dtype_for
from ..files import brief
from ..overrides import parse_overrides
from ..plan import PlanError
from ..planning import build_plan
from ..predict.context import ENGINE, make_context
from ..predict.memory import rank_memory
from .tracing import default_jobs, reused_trace, stage_representatives, trace_ranks

FORMATS = ("table", "json")
GIB = 1024 ** 3


def default_ranks(plan) -> list[int]:
    """The first and last rank of every pipeline stage: between them they hold the
    embedding, the output head and every layer, at both ends of the TP x CP x DP group."""
    lay = plan.layout
    per_stage = lay.tp * lay.cp * lay.dp
    return sorted({r for s in range(lay.pp) for r in (s * per_stage, (s + 1) * per_stage - 1)})


_RANK_SPAN = re.compile(r"(\d{1,18})(?:-(\d{1,18}))?", re.ASCII)


def parse_ranks(text: str, world: int) -> list[int]:
    """'0,7,64-71' or 'all' -> sorted ranks; ValueError with the fix otherwise.

    Every number is checked against the plan's world size, and overlapping spans are
    merged, before any range is expanded: the list built never holds more than `world`
    ranks, whatever the text asks for (`0-999999999` is refused, not built)."""
    if text.strip().lower() == "all":
        return list(range(world))
    spans = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        match = _RANK_SPAN.fullmatch(part)
        if match is None:
            raise ValueError(f"--ranks {brief(text)}: use rank numbers and ranges like "
                             "0,7,64-71 or 'all'")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) else first
        if first > last:
            raise ValueError(f"--ranks {brief(part)}: a range runs from its lower rank to its "
                             "higher, e.g. 64-71")
        if last >= world:
            raise ValueError(f"--ranks {brief(text)}: ranks must be in 0-{world - 1} for this "
                             "plan")
        spans.append((first, last))
    if not spans:
        raise ValueError(f"--ranks {brief(text)}: ranks must be in 0-{world - 1} for this plan")
    ranks: list[int] = []
    for first, last in sorted(spans):
        if ranks and first <= ranks[-1]:
            first = ranks[-1] + 1
        ranks.extend(range(first, last + 1))
    return ranks


def predicted_for_rank(plan, pp_rank: int, config: dict | None = None) -> dict | None:
    """predict's memory model (trainbench's engine sharding) for one pipeline rank, of the
    eager step check traces (a compiled block saves what its partitioner chooses)."""
    eager = replace(plan, compile=False)
    try:
        m = rank_memory(make_context(eager, sharding=ENGINE, config=config, need_device=False),
                        pp_rank)
    except (LookupError, ValueError):
        return None
    return {"weights": m.weights, "gradients": m.gradients, "optimizer": m.optimizer,
            "activations": m.activations, "logits": m.logits, "transient": m.transient,
            "allowance": m.allowance, "total": m.total, "tensors": m.tensors,
            "model_state": m.weights + m.gradients + m.optimizer}


def built_model_state(info: dict) -> int:
    """Bytes of model state a built rank holds at its peak as the engine runs it: the
    sharded master weights, gradients and Adam moments, plus (under PP) the gathered
    weights and unsharded gradients a stage keeps all step (under dp_sharding=optimizer,
    the whole rank's; under gradients, its weights)."""
    return info["state_bytes"] + info["whole_in_step_bytes"]


def microbatches_text(traced: dict) -> str:
    """'16 of the step's 64 microbatches', or '4 microbatches' when it traced them all."""
    step = traced.get("step_microbatches", traced["microbatches"])
    if step == traced["microbatches"]:
        return f"{traced['microbatches']} microbatches"
    return f"{traced['microbatches']} of the step's {step} microbatches"


def gap_pct(predicted: float, measured: float) -> float | None:
    return None if not measured else 100.0 * (predicted - measured) / measured


def check_plan(plan, ranks: list[int], config: dict | None = None, progress=None,
               trace: bool = True, jobs: int = 1) -> dict:
    """Build each rank and put predict's figure for its pipeline rank beside it; with
    `trace`, also trace one rank of each pipeline stage under FakeTensorMode (`jobs` at
    a time) and give the stage's other ranks its trace (check.tracing)."""
    from .build import check_ranks  # torch: loaded by the command, not by `--help`
    results = check_ranks(plan, ranks, progress=progress)
    for info in results:
        if info.get("error"):
            continue
        pred = predicted_for_rank(plan, info["pp"], config)
        info["predicted"] = pred
        built = built_model_state(info)
        info["built_model_state_bytes"] = built
        info["model_state_gap_pct"] = (None if pred is None
                                       else gap_pct(pred["model_state"], built))
    if trace:
        stands_for = stage_representatives(results)
        traced = trace_ranks(plan, sorted(set(stands_for.values())), jobs, progress)
        by_rank = {info["rank"]: info for info in results}
        for rank, traced_rank in stands_for.items():
            info = by_rank[rank]
            info["trace"] = (traced[rank] if rank == traced_rank else
                             reused_trace(traced[traced_rank], info, by_rank[traced_rank]))
            pred, own = info["predicted"], info["trace"]
            if not own.get("error") and pred is not None:
                # Tensors only on both sides: the trace sees no allocator, so predict's
                # fragmentation and buffer allowance is left out of the comparison.
                own["gap_pct"] = gap_pct(pred["tensors"], own["peak_bytes"])
    return {"workload": plan.workload, "size": plan.size, "dtype": plan.dtype,
            "gpus": plan.gpus, "gpu_type": plan.gpu_type, "layout": plan.layout.describe(),
            "ranks": results}


def _layers_text(stages: list[dict]) -> str:
    parts = []
    for s in stages:
        layers = s["layers"]
        span = "-" if not layers else (str(layers[0]) if len(layers) == 1
                                       else f"{layers[0]}-{layers[-1]}")
        extras = [name for name, flag in (("emb", s["embedding"]), ("out", s["output"])) if flag]
        parts.append(f"[{span}]" + ("+" + "+".join(extras) if extras else ""))
    return " ".join(parts)


def print_table(data: dict) -> None:
    table = Table(title=f"{data['workload']} {data['size']} {data['dtype']} on {data['gpus']} "
                        f"x {data['gpu_type']}: {data['layout']} (built on meta, fake process "
                        "group; GiB per rank)")
    for col in ("rank", "pp dp cp tp", "layers", "params held", "stand for", "weights",
                "grads", "Adam", "whole in step", "built state", "predicted state", "gap"):
        table.add_column(col, justify="left" if col in ("layers", "pp dp cp tp") else "right")
    for r in data["ranks"]:
        coords = f"{r['pp']} {r['dp']} {r['cp']} {r['tp']}"
        if r.get("error"):
            table.add_row(str(r["rank"]), coords, f"[red]build failed: {r['error']}[/red]",
                          *[""] * 9)
            continue
        pred = r["predicted"]
        gap = r["model_state_gap_pct"]
        table.add_row(
            str(r["rank"]), coords, _layers_text(r["stages"]), f"{r['params_local']:,}",
            f"{r['params_unsharded']:,}", f"{r['param_bytes'] / GIB:.2f}",
            f"{r['grad_bytes'] / GIB:.2f}", f"{r['optimizer_bytes'] / GIB:.2f}",
            f"{r['whole_in_step_bytes'] / GIB:.2f}", f"{r['built_model_state_bytes'] / GIB:.2f}",
            "-" if pred is None else f"{pred['model_state'] / GIB:.2f}",
            "-" if gap is None else f"{gap:+.1f}%")
    out = console()
    out.print(table)
    for r in data["ranks"]:
        traced = r.get("trace")
        if traced is None:
            continue
        if traced.get("error"):
            out.print(f"rank {r['rank']}: not traced: {traced['error']}", highlight=False)
            continue
        if "traced_rank" in traced:
            out.print(f"rank {r['rank']}: traced peak {traced['peak_bytes'] / GIB:.2f} GiB: "
                      f"rank {traced['traced_rank']}'s forward/backward (same pipeline stage: "
                      "same shapes and schedule) with this rank's own AdamW moments "
                      f"{traced['optimizer_bytes'] / GIB:.2f}"
                      + ("" if traced.get("gap_pct") is None else
                         f"; predicted tensors {traced['gap_pct']:+.1f}%"), highlight=False)
            continue
        parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in traced["categories"].items())
        pred = r["predicted"]
        if pred is None:
            out.print(f"rank {r['rank']}: traced peak {traced['peak_bytes'] / GIB:.2f} GiB "
                      f"({parts}); predict cannot describe this plan", highlight=False)
            continue
        buffers = (f" + pipeline receive buffers {traced['pipeline_buffer_bytes'] / GIB:.2f}"
                   if traced.get("pipeline_buffer_bytes") else "")
        out.print(f"rank {r['rank']}: traced peak {traced['peak_bytes'] / GIB:.2f} GiB = "
                  f"forward/backward of {microbatches_text(traced)} "
                  f"{traced['forward_backward_peak_bytes'] / GIB:.2f} ({parts}) + AdamW "
                  f"moments {traced['optimizer_bytes'] / GIB:.2f}{buffers}; predicted tensors "
                  f"{pred['tensors'] / GIB:.2f} GiB "
                  f"({traced['gap_pct']:+.1f}%), predicted peak with allowance "
                  f"{pred['total'] / GIB:.2f} GiB", highlight=False)
        if traced.get("note"):
            out.print(f"rank {r['rank']}: note: {traced['note']}", highlight=False)
    out.print("weights, grads, Adam: the sharded master weights (fp32, or bf16 under "
              "master_weights=bf16), their gradients and the "
              "two AdamW moments this rank keeps (under PP or dp_sharding=optimizer no sharded "
              "gradient exists during the step: they are reduce-scattered after its last "
              "backward); whole in step: the compute-dtype weights kept gathered all step "
              "under PP (at most three virtual stages' at once under an interleaved "
              "schedule) or dp_sharding=gradients|optimizer, and under PP or "
              "dp_sharding=optimizer the gradients kept whole in the reduce dtype; "
              "predicted state: "
              "`trainbench predict`'s weights + gradients + optimizer for the same pipeline "
              "rank (--sharding engine).", highlight=False)


def check(
    workload: str = typer.Option(..., "-w", "--workload",
                                 help="Workload key, e.g. pretrain_llama3.1."),
    size: str = typer.Option(..., "-s", "--size", envvar="MODEL_SIZE",
                             help="Model size, e.g. 405b."),
    dtype: Optional[str] = typer.Option(None, "--dtype", envvar="DTYPE",
                                        help="bf16, fp8 or fp32; default as `predict`."),
    scale: int = typer.Option(..., "--scale", envvar="JOB_TOTAL_GPUS",
                              help="Number of ranks of the plan (GPUs)."),
    gpu: str = typer.Option("h100", "--gpu", help="GPU type the plan is for (default h100)."),
    sets: Optional[List[str]] = typer.Option(
        None, "--set", help="Override plan fields, e.g. --set 'tp=4 pp=2'."),
    ranks_text: Optional[str] = typer.Option(
        None, "--ranks", help="Ranks to build: 0,7,64-71 or all; default the first and "
                              "last rank of every pipeline stage."),
    fmt: str = typer.Option("table", "--format", help="table or json."),
    trace: bool = typer.Option(
        True, "--trace/--no-trace",
        help="Trace the training step of one rank of each pipeline stage under "
             "FakeTensorMode with FSDPMemTracker (forward and backward of the "
             "microbatches a pipeline rank's schedule runs; the first two without a "
             "pipeline) and report its peak beside predict's; --no-trace only builds "
             "(seconds instead of minutes)."),
    jobs: Optional[int] = typer.Option(
        None, "--jobs", help="Traces run at once, each in its own process; default the "
                             "number of CPU cores."),
):
    """Build chosen ranks of a plan at its real size under a fake process group (no
    GPU, nothing allocated) and report what each holds, beside predict's figure."""
    if fmt not in FORMATS:
        fail(f"unknown --format {fmt!r}; use table or json")
    if scale < 1:
        fail("--scale must be at least 1")
    if jobs is not None and jobs < 1:
        fail("--jobs must be at least 1")
    if gpu.lower() == "cpu":
        fail("check builds a GPU plan's ranks without GPUs; give --gpu h100 (or another "
             "GPU type), not cpu")
    try:
        config = load_config()
    except ValueError as err:
        fail(str(err))
    if dtype is None:
        dtype, _ = default_dtype_for(workload, size, gpu)
    try:
        overrides = parse_overrides(sets or [])
        plan = build_plan(workload, size, dtype, scale, gpu, overrides=overrides)
    except PlanError as err:
        fail("; ".join(err.problems))
    try:
        ranks = (parse_ranks(ranks_text, plan.gpus) if ranks_text is not None
                 else default_ranks(plan))
    except ValueError as err:
        fail(str(err))

    def progress(info: dict) -> None:
        if fmt == "table":
            what = info.get("what", "built")
            state = ((f"not {what}: " if what == "traced" else "failed: ") + info["error"]
                     if info.get("error") else what)
            typer.echo(f"rank {info['rank']}: {state} ({info['build_s']:.1f} s)", err=True)

    data = check_plan(plan, ranks, config=config, progress=progress, trace=trace,
                      jobs=jobs or default_jobs())
    if fmt == "json":
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        print_table(data)
    if any(r.get("error") for r in data["ranks"]):
        raise typer.Exit(1)


def register(app) -> None:
    """Add `trainbench check` to the Typer app."""
    app.command("check")(check)
