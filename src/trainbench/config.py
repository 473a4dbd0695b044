"""The cluster configuration file: one YAML mapping shared by the subsystems.

Location: $TRAINBENCH_CONFIG, else ~/.config/trainbench/cluster.yaml. Each subsystem owns
its keys ('slurm', 'experiments_root', 'env', 'gpu_type', 'gpus_per_node' for the
launcher; 'calibration' and 'bandwidth' for predict) and leaves the others untouched.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def config_path() -> Path:
    env = os.environ.get("TRAINBENCH_CONFIG")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".config" / "trainbench" / "cluster.yaml"


def load_config(path: str | Path | None = None) -> dict:
    """The config as a dict ({} when the file does not exist); ValueError when malformed."""
    import yaml
    p = Path(path) if path else config_path()
    if not p.exists():
        return {}
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"cluster config {p} is not valid YAML: {err}".splitlines()[0]) from None
    if not isinstance(data, dict):
        raise ValueError(f"cluster config {p} must be a YAML mapping")
    return data


def save_config(data: dict, path: str | Path | None = None) -> Path:
    """Write atomically (temp file + rename) so a crash never leaves half a config."""
    import yaml
    p = Path(path) if path else config_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".cluster-", suffix=".yaml")
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump(data, fh, sort_keys=True)
    os.replace(tmp, p)
    return p
