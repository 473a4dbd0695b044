"""Distributed checkpoints with torch.distributed.checkpoint (`.distcp` shards).

What a checkpoint holds: the model and optimizer state from
torch.distributed.checkpoint.state_dict (canonical parameter names, DTensor shards, one
key per parameter), so that loading into a different parallel layout (DP2 -> DP1,
DP2 -> TP2, PP -> DP) is DCP's resharding, not ours; the step count; and each rank's
RNG state. The data position needs nothing more: a batch is
a function of (seed, step, sample index), so the step is the position.

A save is atomic (see checkpoint_dirs): every rank writes into `step-<N>.tmp-<id>/`,
then rank 0, after a barrier, writes the COMPLETE marker and renames the folder.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)

from . import checkpoint_dirs as dirs

_GIB = 1024 ** 3
# One key per parameter for the optimizer too ("state.<fqn>.exp_avg",
# "param_groups.<fqn>.lr"), so pipeline stages that hold different parameters save and
# reshard the optimizer like the model.
_FLAT_OPTIM = StateDictOptions(flatten_optimizer_state_dict=True)
# With several pipeline stages on a rank the optimizer sees them as a ModuleList, whose
# names gain the stage's index ("state.0.layers.4..."): checkpoints use the model's names.
_PART_PREFIX = re.compile(r"^(state|param_groups)\.\d+\.")


def _rng_key(rank: int) -> str:
    return f"rng_rank{rank}"


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _local_bytes(state: dict) -> int:
    """Bytes of this rank's tensors in a (nested) state dict: its part of a checkpoint."""
    total = 0
    for value in state.values():
        if isinstance(value, dict):
            total += _local_bytes(value)
        elif isinstance(value, torch.Tensor):
            local = value.to_local() if hasattr(value, "to_local") else value
            total += local.numel() * local.element_size()
    return total


def format_size(num_bytes: int) -> str:
    if num_bytes >= _GIB:
        return f"{num_bytes / _GIB:.2f} GiB"
    return f"{num_bytes / 1024 ** 2:.2f} MiB"


class Checkpointer:
    """Saves and loads one trainer's model, optimizer, step and RNG state."""

    def __init__(self, model_parts: list[torch.nn.Module], optimizer: torch.optim.Optimizer,
                 device: torch.device, exp_dir: Path, describe_layout: str, log,
                 identity: dict | None = None) -> None:
        """model_parts: this rank's modules (the model, or its pipeline stages); the
        optimizer covers all of them. identity (workload, size, ...) goes into each
        checkpoint's marker so a load into another model is refused before it starts."""
        self.parts = list(model_parts)
        self.optimized = self.parts[0] if len(self.parts) == 1 else torch.nn.ModuleList(self.parts)
        self.optimizer = optimizer
        self.device = device
        self.folder = Path(exp_dir) / dirs.CHECKPOINTS_DIR
        self.layout = describe_layout
        self.identity = dict(identity or {})
        self.log = log  # rank 0's logger; a no-op elsewhere
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._save_id: str | None = None

    # --- save ----------------------------------------------------------------------------

    def _model_state(self) -> dict:
        return {k: v for part in self.parts for k, v in get_model_state_dict(part).items()}

    def _optim_state(self) -> tuple[dict, dict[str, str]]:
        """(optimizer state under checkpoint names, checkpoint name -> this model's name)."""
        raw = get_optimizer_state_dict(self.optimized, self.optimizer, options=_FLAT_OPTIM)
        if len(self.parts) == 1:
            return raw, {k: k for k in raw}
        names = {_PART_PREFIX.sub(r"\1.", k): k for k in raw}
        return {name: raw[k] for name, k in names.items()}, names

    def _state(self, step: int) -> dict:
        return {
            "model": self._model_state(),
            "optim": self._optim_state()[0],
            # A plain tensor every rank holds is saved once (DCP deduplicates it).
            "train": {"step": torch.tensor(step, dtype=torch.int64)},
            _rng_key(self.rank): _rng_state(self.device),
        }

    def _master_dtype(self) -> str:
        dtypes = {str(p.dtype).removeprefix("torch.") for part in self.parts
                  for p in part.parameters()}
        return "/".join(sorted(dtypes))

    def save_id(self) -> str:
        """One id for this run's temporary folders, the same on every rank."""
        if self._save_id is None:
            holder = [uuid.uuid4().hex[:8] if self.rank == 0 else None]
            dist.broadcast_object_list(holder, src=0)
            self._save_id = holder[0]
        return self._save_id

    def save(self, step: int) -> Path:
        """Write `checkpoints/step-<step>/` atomically; every rank must call it."""
        final = self.folder / dirs.final_name(step)
        partial = self.folder / dirs.partial_name(step, self.save_id())
        if self.rank == 0:
            if final.exists():
                raise RuntimeError(f"checkpoint {final} already exists; nothing is overwritten")
            self.folder.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        start = time.time()
        state = self._state(step)
        try:
            dcp.save(state, checkpoint_id=str(partial))
            _maybe_fail_during_save(step, self.rank)
            # Every rank's shards are on disk before the checkpoint becomes visible.
            dist.barrier()
            if self.rank == 0:
                size, files = dirs.size_on_disk(partial)
                record = {**self.identity, "step": step, "saved_at": time.time(),
                          "world_size": self.world_size,
                          "layout": self.layout, "size_bytes": size, "files": files,
                          "torch_version": torch.__version__, "format": dirs.FORMAT,
                          **dirs.manifest(partial)}
                if "architecture" in self.identity:
                    # What the parameters really are, not what the plan says they are.
                    record["architecture"] = {**self.identity["architecture"],
                                              "master_dtype": self._master_dtype()}
                _write_durably(partial / dirs.MARKER_FILE, json.dumps(record, indent=2))
                os.rename(partial, final)
                _fsync_dir(self.folder)
        except (OSError, CheckpointException) as err:
            free = shutil.disk_usage(self.folder).free
            # A write error (a full disk) leaves no half-written files to fill it further.
            # Every rank gets DCP's exception; only rank 0 removes the shared folder, after
            # measuring the disk, so no rank measures a disk another rank just emptied.
            if self.rank == 0:
                shutil.rmtree(partial, ignore_errors=True)
            needed = _local_bytes(state)
            if free < needed:
                # torch's zip writer reports a full disk as "unexpected pos ...", with no
                # errno: what the disk holds says it, so the run names the cause.
                raise OSError(errno.ENOSPC, f"No space left on device: {free} bytes free "
                              f"under {self.folder}, and this rank's part of the checkpoint "
                              f"is {needed} bytes") from err
            raise
        dist.barrier()
        duration = time.time() - start
        self.log(f"Global Checkpoint Save : Rank: 0 : Iteration: {step} : "
                 f"Start time: {start:.3f}s : Save duration: {duration:.3f}s")
        if self.rank == 0:
            self.log(f"Checkpoint saved: {final} ({format_size(size)} on disk, {files} files)")
        return final

    # --- load ----------------------------------------------------------------------------

    def load(self, path: str | Path) -> int:
        """Restore model, optimizer and RNG from a complete checkpoint; returns its step."""
        info = dirs.read_complete(Path(path))  # a partial checkpoint is never loaded
        if "architecture" in self.identity:  # the launcher checked it too; python -m did not
            problem = dirs.model_mismatch(info.record, self.identity.get("workload"),
                                          self.identity.get("size", ""),
                                          self.identity["architecture"])
            if problem:
                raise dirs.CheckpointError(f"checkpoint {info.path} {problem}")
        start = time.time()
        optim_sd, optim_names = self._optim_state()
        state: dict = {"model": self._model_state(), "optim": optim_sd,
                       "train": {"step": torch.zeros((), dtype=torch.int64)}}
        rng_key = _rng_key(self.rank)
        try:
            saved_keys = dcp.FileSystemReader(str(info.path)).read_metadata().state_dict_metadata
            # A rank that did not exist when the checkpoint was saved keeps its seeded RNG.
            has_rng = any(key.startswith(rng_key + ".") for key in saved_keys)
            if has_rng:
                state[rng_key] = _rng_state(self.device)
            dcp.load(state, checkpoint_id=str(info.path))
        except (Exception, CheckpointException) as err:  # noqa: BLE001 - one fault for all
            # Unpickling errors, truncated records, short reads, missing keys: the files
            # are not what this model needs. One line; the traceback goes to the log.
            raise dirs.CheckpointError(
                f"checkpoint {info.path} could not be read: its files are damaged or not from "
                f"this model; load another checkpoint ({_first_line(err)})") from err
        for part in self.parts:
            own = get_model_state_dict(part).keys()
            set_model_state_dict(part, {k: state["model"][k] for k in own})
        set_optimizer_state_dict(self.optimized, self.optimizer,
                                 {optim_names[k]: v for k, v in state["optim"].items()},
                                 options=_FLAT_OPTIM)
        if has_rng:
            torch.set_rng_state(state[rng_key]["cpu"])
            if "cuda" in state[rng_key]:
                torch.cuda.set_rng_state(state[rng_key]["cuda"], self.device)
        step = int(state["train"]["step"])
        if step != info.step:
            raise RuntimeError(f"checkpoint {info.path}: its marker says step {info.step} but "
                               f"its state says {step}; load another checkpoint")
        dist.barrier()
        elapsed = time.time() - start
        self.log(f"Global Checkpoint Load : Rank : 0 : Start time : {start:.3f}s : "
                 f"Time spent in load_checkpoint: {elapsed:.3f}s")
        saved_layout = info.record.get("layout", "?")
        moved = "" if saved_layout == self.layout else f", resharded to {self.layout}"
        self.log(f"Checkpoint loaded: {info.path} (iteration {step}, saved with "
                 f"{saved_layout} on {info.record.get('world_size', '?')} ranks{moved})")
        return step


def checkpointer_for(plan, model_parts: list[torch.nn.Module],
                     optimizer: torch.optim.Optimizer, device: torch.device, exp_dir: Path,
                     log) -> Checkpointer:
    """A plan's checkpointer: its marker names the workload, size, model, experiment and
    architecture, so a load into another model is refused before anything is read."""
    identity = {"workload": plan.workload, "size": plan.size, "model": plan.model.name,
                "experiment": plan.name,
                "architecture": dirs.architecture(plan.model, plan.master_weights)}
    return Checkpointer(model_parts, optimizer, device, exp_dir, plan.layout.describe(), log,
                        identity=identity)


def _first_line(err: BaseException) -> str:
    """'Type: first line' of an error; for DCP's CheckpointException (a BaseException
    that wraps each failed rank's error), of the first rank's error."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))  # (exception, its stack summary)
        err = inner[0] if isinstance(inner, tuple) else inner
    # The first sentence: torch's unpickling errors go on with advice that does not apply.
    text = str(err).strip().split("\n")[0].split(". ")[0][:160]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _maybe_fail_during_save(step: int, rank: int) -> None:
    """Crash injection for tests: TRAINBENCH_FAIL_DURING_SAVE=N [TRAINBENCH_FAIL_RANK=r]
    kills rank r by SIGKILL while saving step N, after its shards are written and
    before the checkpoint is committed: the worst moment for a reader."""
    at = os.environ.get("TRAINBENCH_FAIL_DURING_SAVE")
    victim = int(os.environ.get("TRAINBENCH_FAIL_RANK", "0"))
    if at is not None and int(at) == step and victim == rank:
        os.kill(os.getpid(), signal.SIGKILL)


def _write_durably(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
