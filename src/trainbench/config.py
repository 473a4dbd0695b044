"""The cluster configuration file: one YAML mapping shared by the subsystems.

Location: $TRAINBENCH_CONFIG, else ~/.config/trainbench/cluster.yaml. Each subsystem owns
its keys ('slurm', 'experiments_root', 'env', 'gpu_type', 'gpus_per_node' for the
launcher; 'calibration' and 'bandwidth' for predict) and leaves the others untouched.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml

from .files import NotRegularFile, TooLarge, YAMLBoundError, brief, load_yaml, read_bounded


def config_path() -> Path:
    env = os.environ.get("TRAINBENCH_CONFIG")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".config" / "trainbench" / "cluster.yaml"


FIX = "fix it, or move it aside and run `trainbench init`"


def load_config(path: str | Path | None = None, check: bool = True) -> dict:
    """The config as a dict ({} when the file does not exist); ValueError naming the file
    when it cannot be read, is not YAML or (with `check`) holds a wrongly typed value."""
    p = Path(path) if path else config_path()
    if not p.exists():
        return {}
    if p.is_dir():
        raise ValueError(f"cluster config {p} is a directory, not a YAML file "
                         "(check $TRAINBENCH_CONFIG)")
    try:
        text = read_bounded(p).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"cluster config {p} is not a text file; {FIX}") from None
    except (NotRegularFile, TooLarge) as err:
        raise ValueError(f"cluster config {err} (check $TRAINBENCH_CONFIG)") from None
    except OSError as err:
        raise ValueError(f"cannot read cluster config {p}: {err.strerror}") from None
    try:
        data = load_yaml(text) or {}
    except YAMLBoundError as err:
        raise ValueError(f"cluster config {p} is refused: {err}; {FIX}") from None
    except yaml.YAMLError as err:
        raise ValueError(f"cluster config {p} is not valid YAML: {err}".splitlines()[0]) from None
    if not isinstance(data, dict):
        raise ValueError(f"cluster config {p} must be a YAML mapping")
    if check:
        problem = type_problem(data)
        if problem:
            raise ValueError(f"cluster config {p}: {problem}; {FIX}")
    return data


def type_problem(data: dict) -> str | None:
    """The first key shared by several commands whose value has the wrong type: each
    command would otherwise fail on it in its own way, far from the file."""
    per_node = data.get("gpus_per_node")
    if per_node is not None and (not isinstance(per_node, int) or isinstance(per_node, bool)
                                 or per_node < 1):
        return f"gpus_per_node {brief(per_node)} must be a positive integer"
    for key in ("gpu_type", "experiments_root"):
        if data.get(key) is not None and not isinstance(data[key], str):
            return f"{key} {brief(data[key])} must be a string"
    for key in ("env", "slurm"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            return f"{key} must be a mapping (NAME: value)"
    return None


def save_config(data: dict, path: str | Path | None = None) -> Path:
    """Write atomically (temp file + rename) so a crash never leaves half a config."""
    p = Path(path) if path else config_path()
    blocking = next((d for d in p.parents if d.exists() and not d.is_dir()), None)
    if blocking is not None or p.is_dir():
        raise ValueError(f"cannot write the cluster config {p}: {blocking or p} is "
                         f"{'a file' if blocking else 'a directory'}; set $TRAINBENCH_CONFIG "
                         "to a writable file path")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".cluster-", suffix=".yaml")
    except OSError as err:
        raise ValueError(f"cannot write the cluster config {p}: {err.strerror}; set "
                         "$TRAINBENCH_CONFIG to a writable path") from None
    try:
        with os.fdopen(fd, "w") as fh:
            yaml.safe_dump(data, fh, sort_keys=True)
        os.replace(tmp, p)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError):
            raise ValueError(f"cannot write the cluster config {p}: {err.strerror}") from None
        raise
    return p
