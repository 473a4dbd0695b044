"""Where checkpoints live on disk: names, the commit marker, finding the one to load.

A checkpoint is the folder `<exp>/checkpoints/step-<N>/` (N = steps completed) holding
torch.distributed.checkpoint's `.distcp` shards, its `.metadata`, and trainbench's
`COMPLETE` marker (a small JSON record). A save writes into `step-<N>.tmp-<id>/` and
is renamed only after every rank has written and the marker is in place, so a folder
named `step-<N>` is complete by construction; anything else is an interrupted save and
is never loaded.

The marker also says what the checkpoint is: the model's architecture (every field of
its spec that shapes the parameters or the function they compute, and the dtype of the
master weights), the storage format, and the size of every file with the .metadata's
SHA-256. The launcher checks all of it against the run before anything starts, so a
checkpoint of another model, or one whose files were truncated, replaced or corrupted
since it was written, is refused with one line instead of failing inside the ranks.

Pure Python, no torch: the launcher resolves `--load-checkpoint` before anything starts.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

CHECKPOINTS_DIR = "checkpoints"
MARKER_FILE = "COMPLETE"
DCP_METADATA = ".metadata"
FORMAT = 2
"""Storage format of the tensors; 2: Mamba in_proj/conv rows grouped by B/C group, with
dt_bias, A_log and D under `mixer.ssm` (1, unrecorded: the reference's row order)."""
MASTER_DTYPE = "float32"
"""The dtype of the parameters the optimizer updates, in every run dtype: bf16 and fp8
compute from fp32 master weights (the engine records what it really holds), unless the
plan keeps bf16 master weights (master_dtype)."""
# Spec fields that change neither the parameters nor what they compute: the display name,
# the benchmark's sequence length (a data choice) and Mamba's scan chunk (a blocking of
# the same sums).
_NOT_ARCHITECTURE = ("name", "seq_len", "mamba_chunk")
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
    _check_files(path, record)
    return CheckpointInfo(path=path, step=step, record=record)


def manifest(path: Path) -> dict:
    """What the marker records of a checkpoint's files: each one's size, and the
    SHA-256 of the .metadata (small; it indexes every tensor)."""
    sizes = {item.name: item.stat().st_size for item in sorted(Path(path).iterdir())
             if item.is_file() and item.name != MARKER_FILE}
    digest = hashlib.sha256((Path(path) / DCP_METADATA).read_bytes()).hexdigest()
    return {"file_sizes": sizes, "metadata_sha256": digest}


def _check_files(path: Path, record: dict) -> None:
    """The files the marker lists are there with their recorded sizes, and the .metadata
    is the one written. The shards' bytes are not hashed here (that would read the whole
    checkpoint twice); a damaged shard is named by the engine when it fails to read."""
    sizes = record.get("file_sizes")
    if not isinstance(sizes, dict):
        return  # written before markers listed files
    for name, size in sizes.items():
        item = path / name
        if not item.is_file():
            raise CheckpointError(f"checkpoint {path} is damaged: {name} is missing; "
                                  "load another checkpoint")
        if item.stat().st_size != size:
            raise CheckpointError(f"checkpoint {path} is damaged: {name} has "
                                  f"{item.stat().st_size} bytes, {size} when it was saved; "
                                  "load another checkpoint")
    digest = hashlib.sha256((path / DCP_METADATA).read_bytes()).hexdigest()
    if digest != record.get("metadata_sha256", digest):
        raise CheckpointError(f"checkpoint {path} is damaged: its {DCP_METADATA} changed since "
                              "it was saved (SHA-256 differs); load another checkpoint")


def architecture(spec, master_weights: str = "fp32") -> dict:
    """What a checkpoint must match to load into a model of `spec` (a ModelSpec) whose
    plan keeps `master_weights` (plan.master_weights)."""
    fields = {k: v for k, v in spec.to_dict().items() if k not in _NOT_ARCHITECTURE}
    return {**fields, "master_dtype": master_dtype(spec, master_weights)}


def master_dtype(spec, master_weights: str) -> str:
    """The parameters' dtypes as a checkpoint records them ('/'-joined, sorted): bf16
    master weights keep a hybrid model's Mamba-2 dt_bias, A_log and D in fp32."""
    if master_weights != "bf16":
        return MASTER_DTYPE
    return "bfloat16/float32" if spec.is_hybrid else "bfloat16"


def model_mismatch(record: dict, workload: str, size: str, wanted: dict) -> str | None:
    """Why a checkpoint with this marker cannot load into `workload`/`size` whose
    architecture is `wanted` (see `architecture`), in one line, or None when it can."""
    saved_by = (record.get("workload"), record.get("size"))
    if saved_by[0] and saved_by != (workload, size.lower()):
        return (f"holds {saved_by[0]} {saved_by[1]}, not {workload} {size}; load a checkpoint "
                "of the same model")
    saved = record.get("architecture")
    if record.get("format") != FORMAT or not isinstance(saved, dict):
        return ("was written by an older trainbench whose checkpoints record no model "
                "architecture (or store tensors differently); it cannot be checked against "
                "this model, so it is not loaded: save a new one")
    differ = [f"{key} {saved.get(key, 'unrecorded')} (checkpoint) vs {wanted.get(key)} "
              "(this run)" for key in sorted(set(saved) | set(wanted))
              if saved.get(key) != wanted.get(key)]
    if differ:
        return (f"holds a different model: {', '.join(differ)}; load a checkpoint of the "
                "same architecture (the same --set overrides)")
    return None


def check_model(info: CheckpointInfo, workload: str, size: str, spec,
                master_weights: str = "fp32") -> None:
    """CheckpointError (one line) unless `info` loads into `workload`/`size` built as
    `spec`: what the launcher calls before anything starts, and the engine again."""
    problem = model_mismatch(info.record, workload, size, architecture(spec, master_weights))
    if problem:
        raise CheckpointError(f"checkpoint {info.path} {problem}")


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
                if (child / MARKER_FILE).is_file():
                    raise  # committed, then damaged: never silently passed over
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
