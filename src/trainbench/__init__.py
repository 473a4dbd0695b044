"""trainbench: LLM pretraining benchmarks on PyTorch distributed."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent.parent / "pyproject.toml"


def version() -> str | None:
    """trainbench's version: the installed distribution's; run from a source tree
    (PYTHONPATH=src, as on a bare GPU image), the one its pyproject.toml declares; None
    where neither is there."""
    try:
        return metadata.version("trainbench")
    except metadata.PackageNotFoundError:
        return pyproject_version(PYPROJECT)


def pyproject_version(path: Path) -> str | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    project = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    found = project and re.search(r'^version\s*=\s*"([^"]+)"', project.group(1), re.M)
    return found.group(1) if found else None
