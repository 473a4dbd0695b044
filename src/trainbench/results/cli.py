"""Commands of this subsystem (not written yet)."""


def register(app) -> None:
    """Add this subsystem's commands to the trainbench Typer app."""
