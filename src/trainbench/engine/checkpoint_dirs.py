"""Where checkpoints live on disk: names, the commit marker, finding the one to load.

A checkpoint is the folder `<exp>/checkpoints/step-<N>/` (N = steps completed) holding
torch.distributed.checkpoint's `.distcp` shards, its `.metadata`, and trainbench's
`COMPLETE` marker (a small JSON record). A save writes into `step-<N>.tmp-<id>/` and
is renamed only after every rank has written and the marker is in place, so a folder
named `step-<N>` is complete by construction; anything else is an interrupted save and
is never loaded.

Pure Python, no torch: the launcher resolves `--load-checkpoint` before anything starts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

CHECKPOINTS_DIR = "checkpoints"
MARKER_FILE = "COMPLETE"
DCP_METADATA = ".metadata"
_FINAL = re.compile(r"^step-(\d+)$")
_PARTIAL = re.compile(r"^step-(\d+)\.tmp-[A-Za-z0-9]+$")


class CheckpointError(ValueError):
    """A checkpoint path that cannot be loaded; the message says why and how to fix it."""


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int
    """Training steps completed when it was saved (the next iteration to run)."""
    record: dict
    """The COMPLETE marker's content (layout, world size, model, sizes, time)."""


def final_name(step: int) -> str:
    return f"step-{step}"


def partial_name(step: int, save_id: str) -> str:
    return f"step-{step}.tmp-{save_id}"


def read_complete(path: Path) -> CheckpointInfo:
    """The checkpoint at `path`, or CheckpointError naming what is wrong with it."""
    path = Path(path)
    if _PARTIAL.match(path.name):
        raise CheckpointError(
            f"checkpoint {path} is incomplete: its save was interrupted before it was "
            f"committed; load its parent folder {path.parent} to use the newest complete one")
    marker = path / MARKER_FILE
    if not marker.is_file():
        if (path / DCP_METADATA).is_file() or any(path.glob("*.distcp")):
            raise CheckpointError(
                f"checkpoint {path} has no {MARKER_FILE} marker: it was not committed by a "
                "trainbench save (interrupted, or written by another tool); load a complete "
                "step-N folder")
        raise CheckpointError(f"{path} is not a trainbench checkpoint (no {MARKER_FILE} marker "
                              "and no .distcp files)")
    try:
        record = json.loads(marker.read_text())
        step = int(record["step"])
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckpointError(f"checkpoint {path}: its {MARKER_FILE} marker is unreadable; "
                              "load another checkpoint") from None
    if not (path / DCP_METADATA).is_file():
        raise CheckpointError(f"checkpoint {path} has a {MARKER_FILE} marker but no "
                              f"{DCP_METADATA}: its files were removed; load another checkpoint")
    return CheckpointInfo(path=path, step=step, record=record)


def scan(folder: Path) -> tuple[list[CheckpointInfo], list[Path]]:
    """(complete checkpoints oldest first, interrupted saves) directly under `folder`."""
    complete, partial = [], []
    for child in sorted(Path(folder).iterdir()):
        if not child.is_dir():
            continue
        if _PARTIAL.match(child.name):
            partial.append(child)
        elif _FINAL.match(child.name):
            try:
                complete.append(read_complete(child))
            except CheckpointError:
                partial.append(child)
    complete.sort(key=lambda info: info.step)
    return complete, partial


def resolve(path: str | Path) -> tuple[CheckpointInfo, list[Path]]:
    """The checkpoint to load for `--load-checkpoint PATH`, and interrupted saves skipped.

    PATH may be a `step-N` folder, a `checkpoints/` folder (its newest complete
    checkpoint) or an experiment directory holding one. Never falls back to a fresh
    start: a folder with no complete checkpoint is an error with the fix.
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"--load-checkpoint {path}: no such directory")
    if _FINAL.match(path.name) or _PARTIAL.match(path.name) or (path / MARKER_FILE).exists() \
            or (path / DCP_METADATA).exists():
        return read_complete(path), []
    folder = path / CHECKPOINTS_DIR if (path / CHECKPOINTS_DIR).is_dir() else path
    complete, partial = scan(folder)
    if not complete:
        found = (f"only interrupted saves ({', '.join(p.name for p in partial)})" if partial
                 else "nothing")
        raise CheckpointError(
            f"no complete checkpoint in {folder}: found {found}; point --load-checkpoint at a "
            "checkpoints/ folder or a step-N folder written by `trainbench run --checkpoint`")
    newest = complete[-1]
    skipped = [p for p in partial if _step_of(p) >= newest.step]
    return newest, skipped


def _step_of(path: Path) -> int:
    match = _FINAL.match(path.name) or _PARTIAL.match(path.name)
    return int(match.group(1)) if match else -1


def size_on_disk(path: Path) -> tuple[int, int]:
    """(bytes, files) of everything under `path`."""
    total = count = 0
    for item in Path(path).rglob("*"):
        if item.is_file():
            total += item.stat().st_size
            count += 1
    return total, count
