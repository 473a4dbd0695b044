"""`trainbench results` and `trainbench plot`. Everything heavy (rich, matplotlib) is
imported inside the command bodies, so importing the CLI stays fast."""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from .. import metrics
from ..config import load_config
from ..console import console, fail
from ..errors import InputError
from ..rundir import checked_root, creatable_problem, experiments_root
from . import report
from .baseline import check_inputs, run_gate
from .plot import write_plots
from .summary import check_options, summarize_paths

_PATHS_HELP = ("Experiment directories, trees of them, or log files "
               "(default: <root>/experiments, where `trainbench run` writes).")
# Where `run` writes (the same resolution as run's --root), read when no path is given.
_ROOT_OPT = typer.Option(None, "--root", envvar="TRAINBENCH_ROOT",
                         help="Experiments root read when no path is given (default: the "
                              "cluster config's experiments_root, else .).")
_WINDOW_HELP = ("Iterations A-B to average, 0-based and inclusive (NeMo's 'iteration 11/49' "
                "is 11); default: the seeds' 11-44 of 50, scaled to each run's length.")
_CONVENTION_HELP = "FLOPs convention for TFLOPS and MFU: 'published' (the seeds') or 'causal'."
_FOREIGN = "For logs of other frameworks whose name does not say it: "
# The identity of foreign logs: the same options on `results` and `plot`.
_WORKLOAD_OPT = typer.Option(None, "-w", "--workload", help=_FOREIGN + "workload key.")
_SIZE_OPT = typer.Option(None, "-s", "--size", help=_FOREIGN + "model size.")
_DTYPE_OPT = typer.Option(None, "--dtype", help=_FOREIGN + "bf16 or fp8.")
_SCALE_OPT = typer.Option(None, "--scale", help=_FOREIGN + "number of GPUs.")
_GPU_OPT = typer.Option("h100", "--gpu", help=_FOREIGN + "GPU type (the seeds' is h100).")


def _default_paths(root: Path | None) -> list[Path]:
    """<root>/experiments: what `trainbench run` wrote, never every log under the current
    directory (in a source tree that would list its test fixtures)."""
    try:  # the config's errors and RootError (experiment.checked_root) are ValueErrors
        root = (experiments_root(load_config()) if root is None
                else checked_root(root, "--root (or TRAINBENCH_ROOT)"))
    except ValueError as err:
        fail(str(err).splitlines()[0])
    where = Path(root) / "experiments"
    if not where.is_dir():
        fail(f"no experiments yet under {where} (where `trainbench run` writes); pass the "
             "directories or log files to read, or --root")
    return [where]


def _summarize(paths, window, convention, workload, size, dtype, scale, gpu, root=None,
               tolerance_pct=None):
    """Results of every experiment under paths, or a clean exit 2 saying what is wrong."""
    try:
        check_options(convention, workload, size, dtype, scale, gpu)
    except ValueError as err:
        fail(str(err))
    win = None
    if window is not None:
        try:
            win = metrics.parse_window(window)
        except ValueError as err:
            fail(f"--window: {err}")
    roots = list(paths) if paths else _default_paths(root)
    skipped: list[str] = []
    try:
        more = {} if tolerance_pct is None else {"tolerance_pct": tolerance_pct}
        results = summarize_paths(roots, skipped=skipped, window=win, convention=convention,
                                  workload=workload, size=size, dtype=dtype, scale=scale,
                                  gpu=gpu, **more)
    except OSError as err:  # a path given that does not exist
        fail(str(err) if isinstance(err, FileNotFoundError) else
             f"cannot read {err.filename}: {err.strerror}")
    if not results:
        if skipped:  # what was there could not be read: say that, not "nothing found"
            fail(skipped[0] + (f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""))
        fail(f"no experiments found under {', '.join(map(str, roots))}; an experiment is a "
             "directory with plan.json or metrics.jsonl, or a *.out/*.log file with step lines")
    # The runs that could be read are reported; each one that could not is named once.
    for line in skipped:
        typer.echo(f"trainbench: warning: {line}", err=True)
    return results, skipped


def _write_new_file(path: Path, text: str) -> None:
    """Write a file that must not exist yet, through a temporary name (never half-written)."""
    _check_new_file(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as err:
        fail(f"cannot write -o {path}: {err.strerror}")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError):
            fail(f"cannot write -o {path}: {err.strerror}")
        raise


def _check_new_file(path: Path) -> None:
    """-o names a new file in a writable directory; checked before any log is read."""
    if path.exists():
        fail(f"{path} already exists; results never overwrite a file, choose another -o")
    if not path.parent.is_dir():
        fail(f"-o {path}: {path.parent} " + ("is not a directory" if path.parent.exists()
                                              else "does not exist"))
    problem = creatable_problem(path)
    if problem:
        fail(f"-o {path}: {problem}")


def _exit_for(code: int) -> None:
    """A failed baseline or reference check ends the command with its exit code."""
    if code:
        raise typer.Exit(code)


def results_command(
    paths: Optional[list[Path]] = typer.Argument(None, help=_PATHS_HELP, show_default=False),
    fmt: str = typer.Option("table", "--format", "-f", help="table, csv or json."),
    window: Optional[str] = typer.Option(None, "--window", help=_WINDOW_HELP),
    sort: Optional[str] = typer.Option(
        None, "--sort", help="Column to sort by (gpus, step_time, tokens, tflops, mfu, "
                             "days, memory, status, name, ...); --sort=-mfu for descending."),
    convention: str = typer.Option("published", "--convention", help=_CONVENTION_HELP),
    output: Optional[Path] = typer.Option(None, "-o", "--output",
                                          help="Write to this new file instead of stdout."),
    workload: Optional[str] = _WORKLOAD_OPT,
    size: Optional[str] = _SIZE_OPT,
    dtype: Optional[str] = _DTYPE_OPT,
    scale: Optional[int] = _SCALE_OPT,
    gpu: str = _GPU_OPT,
    records: bool = typer.Option(False, "--records", help="JSON: include every step record."),
    root: Optional[Path] = _ROOT_OPT,
    baseline: Optional[list[Path]] = typer.Option(
        None, "--baseline", help="Check each plan against a baseline: a file written by "
                                 "--save-baseline, or earlier experiment directories "
                                 "(repeatable). Exit 1 when a plan fails.",
        show_default=False),
    save_baseline: Optional[Path] = typer.Option(
        None, "--save-baseline", help="Write these runs' per-plan baseline to this new "
                                      "JSON file."),
    reference: bool = typer.Option(False, "--reference", help="Check each plan against "
                                   "the published tables (>= 100-tolerance % of their "
                                   "tokens/s). Exit 1 when a plan fails."),
    tolerance: float = typer.Option(5.0, "--tolerance", help="Tolerance in percent of "
                                    "verdicts, --baseline and --reference."),
):
    """Status, step times, throughput and MFU of runs, against the references.

    Every experiment under the given paths: trainbench runs and logs of NeMo 1/2,
    Megatron-LM/Bridge, Megatron-DeepSpeed, MaxText and torchtitan, one row each, with
    a summary line; a log in another format is listed as Unrecognised."""
    if fmt not in report.FORMATS:
        fail(f"unknown --format {fmt!r}; use one of {', '.join(report.FORMATS)}")
    if sort:
        try:
            report.sort_key_name(sort)
        except ValueError as err:
            fail(str(err))
    if output is not None:
        _check_new_file(output)
    try:
        base = check_inputs(baseline, save_baseline, tolerance, window, convention,
                            workload, size, dtype, scale, gpu)
        results, unread = _summarize(paths, window, convention, workload, size, dtype,
                                     scale, gpu, root, tolerance)
        results = report.sort_results(results, sort)
        gate = run_gate(results, base, reference, save_baseline, tolerance)
    except InputError as err:
        fail(str(err))
    _emit(results, unread, gate, fmt, output, records, convention)


def _emit(results, unread, gate, fmt: str, output: Path | None, records: bool,
          convention: str) -> None:
    """Print (or write to the new file `output`) the results in fmt with the gate's lines,
    then end with the gate's exit code."""
    if fmt == "csv":
        text = report.to_csv(results, gate.csv_columns(results))
    elif fmt == "json":
        extra = {**gate.json(), **({"unread": unread} if unread else {})}
        text = report.to_json(results, with_records=records, extra=extra) + "\n"
    elif output is not None:
        buf = io.StringIO()
        report.print_table(results, Console(file=buf, width=250, color_system=None),
                           convention, fit=False)
        text = buf.getvalue() + "".join(line + "\n" for line in gate.lines())
    else:
        report.print_table(results, console(), convention)
        for line in gate.lines():
            typer.echo(line)
        _exit_for(gate.finish(fmt))
        return
    if output is not None:
        _write_new_file(output, text)
        typer.echo(f"wrote {output} ({len(results)} experiment(s)); "
                   + report.summary_line(results))
    else:
        typer.echo(text, nl=False)
    _exit_for(gate.finish(fmt))


def plot_command(
    paths: Optional[list[Path]] = typer.Argument(None, help=_PATHS_HELP, show_default=False),
    out_dir: Path = typer.Option(..., "-o", "--out", help="Directory for the PNG files "
                                                          "(created; existing charts are "
                                                          "never overwritten)."),
    window: Optional[str] = typer.Option(None, "--window", help=_WINDOW_HELP),
    convention: str = typer.Option("published", "--convention", help=_CONVENTION_HELP),
    workload: Optional[str] = _WORKLOAD_OPT,
    size: Optional[str] = _SIZE_OPT,
    dtype: Optional[str] = _DTYPE_OPT,
    scale: Optional[int] = _SCALE_OPT,
    gpu: str = _GPU_OPT,
    root: Optional[Path] = _ROOT_OPT,
):
    """PNG charts of runs: scaling against the reference, step times, losses.

    scaling.png: tokens/s and MFU against GPU count with the reference curve (weak
    scaling); step_time_<run>.png: step time per iteration, warm-up and window shaded;
    loss.png: loss curves."""
    if out_dir.exists() and not out_dir.is_dir():
        fail(f"{out_dir} is a file; -o takes a directory")
    problem = creatable_problem(out_dir)
    if problem:
        fail(f"-o {out_dir}: {problem}")
    results, _ = _summarize(paths, window, convention, workload, size, dtype, scale, gpu,
                            root)
    try:
        written = write_plots(results, out_dir, convention)
    except FileExistsError as err:
        fail(str(err))
    except OSError as err:
        fail(f"cannot write the charts into {out_dir}: {err.strerror}")
    if not written:
        fail("no run has step data to plot")
    for path in written:
        typer.echo(f"wrote {path}")


def register(app) -> None:
    """Add `results` and `plot` to the trainbench Typer app."""
    app.command("results")(results_command)
    app.command("plot")(plot_command)
