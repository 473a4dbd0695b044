"""Experiment directories: `<root>/experiments/<name>/<name>_<timestamp>/`, never reused.

<name> is `<workload>_<size>_<dtype>_gpus<N>` (plan.experiment_name). The directory holds
plan.json, log-<name>.out, metrics.jsonl, run.json (written by the engine), exit.json
(written by the launcher), the sbatch script, profile/ and checkpoints/.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PLAN_FILE = "plan.json"
METRICS_FILE = "metrics.jsonl"
RUN_FILE = "run.json"
EXIT_FILE = "exit.json"


def default_root() -> Path:
    """$TRAINBENCH_ROOT, else the current directory (the seeds' $STAGE_PATH habit)."""
    return Path(os.environ.get("TRAINBENCH_ROOT", ".")).resolve()


def log_file_name(name: str) -> str:
    return f"log-{name}.out"


def new_experiment_dir(root: str | Path, name: str) -> Path:
    """Create a fresh directory for one run; an existing one is never overwritten.

    The timestamp has second resolution like the seeds' `date +%s`; runs started in the
    same second get a numeric suffix instead of sharing a directory.
    """
    parent = Path(root) / "experiments" / name
    parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        candidate = parent / (f"{name}_{stamp}" + (f"-{n}" if n else ""))
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise RuntimeError(f"could not create a new experiment directory under {parent}")
