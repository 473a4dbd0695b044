"""What the command-line modules share to talk to a user: one error line with its exit
code, and a console for tables. Library code never needs this module (it raises
errors.InputError instead). Imports only typer, so `trainbench --help` stays free of
torch."""

from __future__ import annotations

import sys

import typer


def fail(message: str, code: int = 2) -> "typer.Exit":
    """One clear line on stderr and a non-zero exit; never a traceback."""
    typer.echo(f"trainbench: error: {message}", err=True)
    raise typer.Exit(code)


def console():
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # rich would exit 1; main() treats a closed pipe as the quiet success it is.
            self.quiet = True
            raise BrokenPipeError

    # Piped output (CI logs, `| tee`) gets wide tables instead of rich's 80 columns.
    return _Console() if sys.stdout.isatty() else _Console(width=200)
