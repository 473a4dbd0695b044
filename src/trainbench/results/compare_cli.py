"""`trainbench compare`: two runs, or two sets of repeats, side by side (results/compare.py).
Nothing heavy is imported at module level, so `trainbench --help` stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .. import metrics
from ..console import console, fail
from .compare import compare, load_side, print_comparison, to_json

_USAGE = ("compare needs two sides: `trainbench compare A B` (two experiment directories or "
          "logs), or sets of repeats with `--a A1 --a A2 --b B1 --b B2`")


def register(app) -> None:
    """Add `compare` to the trainbench Typer app."""
    @app.command("compare")
    def compare_command(
        paths: Optional[list[Path]] = typer.Argument(
            None, help="Two experiments: A then B (directories, or logs `results` reads).",
            show_default=False),
        a: Optional[list[Path]] = typer.Option(
            None, "--a", help="A run of side A (repeatable: a set of repeats of one plan).",
            show_default=False),
        b: Optional[list[Path]] = typer.Option(
            None, "--b", help="A run of side B (repeatable).", show_default=False),
        fmt: str = typer.Option("table", "--format", "-f", help="table or json."),
        window: Optional[str] = typer.Option(
            None, "--window", help="Iterations A-B of every run to compare (0-based, "
                                   "inclusive); default: the seeds' 11-44 of 50, scaled."),
        convention: str = typer.Option("published", "--convention",
                                       help="FLOPs convention for TFLOPS and MFU."),
    ):
        """Metrics of two runs (or sets) side by side, whether each gap is outside the
        run-to-run noise, and the differences in their conditions, most likely cause first.

        With one run per side the noise is judged from the step times of the two windows
        (Welch's t-test); with sets of repeats, from the runs' own figures. Always exits 0
        on valid input: the comparison informs, it does not gate."""
        if fmt not in ("table", "json"):
            fail(f"unknown --format {fmt!r}; use table or json")
        if a or b:
            if paths:
                fail(f"give the sides either as two paths or with --a/--b, not both; {_USAGE}")
            if not (a and b):
                fail(f"side {'B' if a else 'A'} is missing; {_USAGE}")
            side_paths = (list(a), list(b))
        else:
            if len(paths or []) != 2:
                fail(f"{len(paths or [])} path(s) given; {_USAGE}")
            side_paths = ([paths[0]], [paths[1]])
        for path in side_paths[0] + side_paths[1]:
            if not path.exists():
                fail(f"{path} does not exist; pass an experiment directory or a log file")
        win = None
        if window is not None:
            try:
                win = metrics.parse_window(window)
            except ValueError as err:
                fail(f"--window: {err}")
        try:
            sides = [load_side(label, ps, window=win, convention=convention)
                     for label, ps in zip("AB", side_paths)]
        except (FileNotFoundError, PermissionError, ValueError) as err:
            fail(str(err))
        result = compare(*sides)
        if fmt == "json":
            typer.echo(to_json(result))
        else:
            print_comparison(result, console())
