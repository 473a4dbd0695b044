"""What the command-line modules share to talk to a user: one error line with its exit
code, and a console for tables. Library code never needs this module (it raises
errors.InputError instead). Imports only typer, so `trainbench --help` stays free of
torch."""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console


def fail(message: str, code: int = 2) -> "typer.Exit":
    """One clear line on stderr and a non-zero exit; never a traceback."""
    typer.echo(f"trainbench: error: {message}", err=True)
    raise typer.Exit(code)


def console():
    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # rich would exit 1; main() treats a closed pipe as the quiet success it is.
            self.quiet = True
            raise BrokenPipeError

    # A terminal's width, or COLUMNS where it is set (rich reads it); piped output without
    # COLUMNS (CI logs, `| tee`) gets wide tables instead of rich's 80 columns.
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return _Console()
    return _Console(width=200)
