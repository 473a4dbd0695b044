"""trainbench's command line: a thin Typer app over catalog, plan, launch and results.

Importing this module must not import torch (fast `--help`, `list`, `show`, `flops`):
commands import what they need inside their bodies.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import List, Optional

import typer
from rich.table import Table

from . import describe, flops as fl, metrics
from .catalog import hardware, models, recipes
from .console import console, fail
from .errors import InputError
from .overrides import parse_overrides
from .plan import PlanError
from .planning import shape_model

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="LLM pretraining benchmarks on PyTorch distributed: the NVIDIA recipe workloads, "
         "on this machine or a Slurm cluster, compared with the published numbers.",
)


def _version(value: bool) -> None:
    if value:
        try:
            typer.echo(f"trainbench {version('trainbench')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("trainbench (version unknown: not installed)")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                       help="Print trainbench's version and exit.")) -> None:
    """LLM pretraining benchmarks on PyTorch distributed: the NVIDIA recipe workloads, on
    this machine or a Slurm cluster, compared with the published numbers."""


WORKLOAD_OPT = typer.Option(..., "-w", "--workload", help="Workload key, e.g. pretrain_llama3.1.")
SIZE_OPT = typer.Option(..., "-s", "--size", envvar="MODEL_SIZE", help="Model size, e.g. 8b, tiny.")


@app.command("list")
def list_workloads(
    workload: Optional[str] = typer.Option(None, "-w", "--workload", help="Only this workload."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Only rows for this GPU type."),
):
    """Workloads, sizes, dtypes and the scales each has a recipe for."""
    if workload and workload not in models.WORKLOADS:
        fail(f"unknown workload {workload!r}; known workloads: {', '.join(models.WORKLOADS)}")
    table = Table(title="trainbench workloads")
    for col in ("workload", "size", "dtype", "gpu", "scales (ranks)", "layout at smallest scale"):
        table.add_column(col)
    for wl in models.WORKLOADS:
        if workload and wl != workload:
            continue
        for size in models.sizes(wl):
            for dtype in recipes.dtypes_for(wl, size):
                rows = recipes.rows_for(wl, size, dtype, gpu)
                if not rows:
                    continue
                gpus = sorted({r.gpu_type for r in rows})
                first = min(rows, key=lambda r: r.gpus)
                layout = (f"TP{first.tp} PP{first.pp} CP{first.cp} DP{first.dp}"
                          + (f" VP{first.vp}" if first.vp > 1 else "")
                          + f" MBS{first.mbs} GBS{first.gbs} GA{first.ga}")
                table.add_row(wl, size, dtype, ",".join(gpus),
                              " ".join(str(r) for r in sorted({r.gpus for r in rows})), layout)
    console().print(table)


def _resolve_model(workload: str, size: str):
    try:
        return models.get_model(workload, size)
    except LookupError as err:
        fail(str(err))


def _shaped_model(model, settings: List[str]):
    """`show --set`: the model cut by layers=N, pattern=... or experts=N (other keys shape
    a run)."""
    try:
        overrides = parse_overrides(settings)
        other = sorted(set(overrides) - {"layers", "pattern", "experts"})
        if other:
            fail(f"show --set takes layers, pattern and experts (the model's shape), not "
                 f"{', '.join(other)}; `trainbench run --dry-run` or `predict` show a layout")
        return shape_model(model, overrides.get("layers"), overrides.get("pattern"),
                           overrides.get("experts"))
    except PlanError as err:
        fail(err.problems[0])


@app.command()
def show(
    workload: str = WORKLOAD_OPT,
    size: str = SIZE_OPT,
    dtype: Optional[str] = typer.Option(None, "--dtype", envvar="DTYPE", help="bf16, fp8 or fp32."),
    scale: Optional[int] = typer.Option(None, "--scale", envvar="JOB_TOTAL_GPUS",
                                        help="Number of ranks (GPUs)."),
    gpu: str = typer.Option("h100", "--gpu", help="GPU type for the recipe and the reference."),
    settings: List[str] = typer.Option([], "--set", help="'layers=N' (a hybrid keeps its "
                                       "pattern's mix), 'pattern=M-*M-' or 'experts=N' (an "
                                       "MoE's routed experts, top_k kept): the cut model."),
):
    """Architecture, parameter count, FLOPs per sequence, recipe rows and references."""
    size = size.lower()
    model = _resolve_model(workload, size)
    if gpu.lower() not in hardware.GPUS and gpu.lower() != hardware.CPU:
        fail(f"unknown GPU type {gpu!r}; known types: {', '.join(hardware.GPUS)} (or 'cpu')")
    dtypes = recipes.dtypes_for(workload, size)
    if dtype and dtype.lower() not in dtypes:
        fail(f"{workload} {size} has no {dtype} recipe; dtypes: {', '.join(dtypes)}")
    rows = [r for r in recipes.rows_for(workload, size, dtype and dtype.lower(), gpu.lower())
            if scale is None or r.gpus == scale]
    if scale is not None and not rows:
        scales = recipes.scales_for(workload, size, dtype.lower() if dtype else dtypes[0])
        fail(f"{workload} {size} has no recipe row for scale {scale}; scales: "
             + ", ".join(map(str, scales)))
    # The 405B proxies' depth depends on the scale: show the rows' depth when it is one.
    depths = sorted({r.layers for r in rows})
    catalog_model = model  # the published references ran it whole
    if settings:
        model = _shaped_model(model, settings)
    elif not model.is_hybrid and len(depths) == 1 and depths[0] != model.layers:
        model = model.with_layers(depths[0])
    out = console()
    out.print(describe.architecture_table(model, workload, size, rows))
    recipe, notes = describe.recipe_table(rows)
    out.print(recipe)
    for line in notes:
        out.print(line, highlight=False, markup=False)
    refs = describe.reference_table(catalog_model, workload, size, dtype, scale)
    if refs is not None:
        out.print(refs)


@app.command()
def flops(
    workload: str = WORKLOAD_OPT,
    size: str = SIZE_OPT,
    convention: str = typer.Option("published", "--convention",
                                   help="'published' (the seed's formula) or 'causal' (Megatron)."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Sequence length."),
    gbs: Optional[int] = typer.Option(None, "--gbs", help="Global batch for MFU."),
    step_time: Optional[float] = typer.Option(None, "--step-time", help="Seconds per step."),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs for MFU."),
    gpu: str = typer.Option("h100", "--gpu", help="GPU type for the peak."),
    dtype: str = typer.Option("bf16", "--dtype", help="Peak dtype."),
    peak_tflops: Optional[float] = typer.Option(None, "--peak-tflops",
                                                help="Peak TFLOPS of an unknown device."),
):
    """FLOPs per sequence by part; with --gbs/--step-time/--gpus, also tokens/s and MFU."""
    model = _resolve_model(workload, size)
    if convention not in fl.CONVENTIONS:
        fail(f"unknown convention {convention!r}; use one of {', '.join(fl.CONVENTIONS)}")
    if seq_len is not None and seq_len < 1:
        fail("--seq-len must be at least 1")
    seq = seq_len or model.seq_len
    # Every option is checked before anything is printed: no table, then an error.
    named = {"--gbs": gbs, "--step-time": step_time, "--gpus": gpus}
    missing = [name for name, value in named.items() if value is None]
    if 0 < len(missing) < len(named):
        fail(f"MFU needs all of --gbs, --step-time and --gpus; add {', '.join(missing)} "
             "(or drop the others for FLOPs alone)")
    peak = None
    if not missing:
        if min(gbs, gpus) < 1:
            fail("--gbs and --gpus must be at least 1")
        if not math.isfinite(step_time) or step_time <= 0:
            fail(f"--step-time must be a positive number of seconds, not {step_time:g}")
        if peak_tflops is not None and not (math.isfinite(peak_tflops) and peak_tflops > 0):
            fail(f"--peak-tflops must be a positive number, not {peak_tflops:g}")
        peak = peak_tflops
        if peak is None:
            try:
                peak = hardware.get_gpu(gpu).peak(dtype)
            except LookupError as err:
                fail(str(err))
            if peak is None:
                fail(f"{gpu} has no {dtype} peak; pass --peak-tflops")
    parts = fl.flops_breakdown(model, seq, convention)
    total = sum(parts.values())
    for part, value in parts.items():
        if value:
            typer.echo(f"{part:>10}: {value:.4e}  ({100 * value / total:.1f}%)")
    line = f"{'total':>10}: {total:.4e} FLOPs per sequence of {seq} tokens ({convention})"
    if convention == "published":  # the seeds print their own formula's figure, rounded
        line += f", {fl.round_sig(total):.3g} as the seeds print it"
    typer.echo(line)
    if not missing:
        tps = metrics.tokens_per_second(seq, gbs, step_time)
        typer.echo(f"tokens/s: {tps:,.2f}  days per 1T tokens: {metrics.days_to_train(tps):.2f}")
        mfu_pct = 100 * metrics.mfu(gbs, total, step_time, gpus, peak)
        # An impossible MFU (above 100%) is shown as INVALID with its reason, never a figure.
        mfu_text = metrics.mfu_problem(mfu_pct, peak) or f"{mfu_pct:.2f}% of {peak:g} TFLOPS"
        typer.echo(f"TFLOPS/GPU: {metrics.tflops_per_gpu(gbs, total, step_time, gpus):.1f}  "
                   f"MFU ({convention}): {mfu_text}")


# Commands that live with their subsystem register themselves here; their modules keep
# torch out of `trainbench --help` (torch loads where a command body needs it).
COMMAND_MODULES = ("launch.run_cli", "results.cli", "predict.cli", "launch.slurm_cli",
                   "check.cli", "launch.probe_cli", "results.compare_cli", "accept.cli")
for _module in COMMAND_MODULES:
    importlib.import_module(f"trainbench.{_module}").register(app)


def _click_exceptions() -> list:
    """The modules whose UsageError/Abort the app may raise: Typer >= 0.17 vendors its
    own copy of click, older Typer uses click itself."""
    found = []
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            found.append(importlib.import_module(name))
        except ImportError:
            pass
    return found


def usage_error_line(err) -> str:
    """A usage error (malformed value, unknown option, missing option) as one line, in the
    format of every other error, instead of the multi-line usage box."""
    text = " ".join(err.format_message().split())
    ctx = getattr(err, "ctx", None)
    if ctx is not None and ctx.command_path:
        text += f" (see `{ctx.command_path} --help`)"
    return text


def _quiet_closed_pipe() -> None:
    """The reader (`| head`) has what it wanted: exit 0, silently. As Python's signal docs
    advise, stdout is pointed at devnull so the interpreter's final flush raises nothing."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.__stdout__.fileno())
    except (OSError, ValueError):
        pass
    sys.exit(0)


def main() -> None:
    # A file name that is not UTF-8 (shown by a table or a message) prints as \xNN
    # escapes instead of ending the command in UnicodeEncodeError.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    # Not standalone: click hands usage errors back here instead of printing its box.
    kinds = _click_exceptions()
    try:
        code = app(standalone_mode=False)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
    except BrokenPipeError:
        _quiet_closed_pipe()
    except SystemExit as exc:
        # Typer, like click, answers a closed pipe (EPIPE) with exit 1 after wrapping
        # stdout in PacifyFlushWrapper; that wrapper is how the case is told apart.
        if exc.code == 1 and type(sys.stdout).__name__ == "PacifyFlushWrapper":
            _quiet_closed_pipe()
        raise
    except KeyboardInterrupt:
        typer.echo("trainbench: interrupted", err=True)
        sys.exit(130)
    except InputError as err:  # bad input a library module raised: one line, exit 2
        typer.echo(f"trainbench: error: {err}", err=True)
        sys.exit(2)
    except Exception as err:  # noqa: BLE001 - re-raised unless it is a usage error
        def raised(name: str) -> bool:  # not every copy of click defines every class
            return any(isinstance(err, getattr(k, name)) for k in kinds if hasattr(k, name))
        if raised("NoArgsIsHelpError"):
            typer.echo(err.ctx.get_help())
            sys.exit(2)
        if raised("UsageError"):
            typer.echo(f"trainbench: error: {usage_error_line(err)}", err=True)
            sys.exit(2)
        if raised("Abort"):
            typer.echo("trainbench: interrupted", err=True)
            sys.exit(130)
        if raised("ClickException"):
            typer.echo(f"trainbench: error: {' '.join(err.format_message().split())}", err=True)
            sys.exit(err.exit_code)
        raise
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
