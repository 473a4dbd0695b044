"""`trainbench accept`: the options mapped to an AcceptRequest, the progress and the
table printed. Importing this module imports no torch."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from ..console import fail
from . import AcceptError, AcceptRequest, run_acceptance
from .report import text


def register(app: typer.Typer) -> None:
    @app.command()
    def accept(
        quick: bool = typer.Option(False, "--quick", help="A subset: Llama 3.1 in bf16 and "
                                   "FP8, Nemotron-H in FP8, DeepSeek-V3 in bf16 (on a CPU "
                                   "their builds too), and the checkpoint, profile and "
                                   "probe rows."),
        out: Optional[Path] = typer.Option(None, "--out", help="A new directory for the "
                                           "report, logs and runs (default: "
                                           "acceptance/<timestamp>)."),
        steps: Optional[int] = typer.Option(None, "--steps", help="Steps per training run "
                                            "(default 10 on a GPU, 2 on a CPU)."),
        only: Optional[str] = typer.Option(None, "--only", help="Rows whose label contains "
                                           "one of these, comma-separated: "
                                           "'llama3.1,probe'."),
        time_limit: List[str] = typer.Option([], "--time-limit", help="Seconds per command "
                                             "(default 300 on a GPU, 180 on a CPU), or "
                                             "ROW=SECONDS for some rows; repeatable."),
    ):
        """Build and run every workload family's one-GPU proxy in bf16 and FP8 beside
        predict, a checkpoint save and resume, a profiled step and a probe: the first
        thing to run on a new GPU node. Exit 1 when a row failed or timed out."""
        keys = tuple(k.strip() for k in (only or "").split(",") if k.strip())
        if only is not None and not keys:
            fail("--only needs row names, e.g. --only llama3.1,probe")
        req = AcceptRequest(quick=quick, out=out, steps=steps, only=keys,
                            time_limits=tuple(time_limit), argv=tuple(sys.argv[1:]))
        try:
            report, directory = run_acceptance(req, echo=lambda line: typer.echo(line))
        except AcceptError as err:
            fail(str(err))
        typer.echo("")
        typer.echo(text(report), nl=False)
        typer.echo(f"report: {directory / 'acceptance.md'} and acceptance.json")
        if report.failed:
            raise typer.Exit(1)
