"""Experiment directories: `<root>/experiments/<name>/<name>_<timestamp>/`, never reused.

<name> is `<workload>_<size>_<dtype>_gpus<N>` (plan.experiment_name). The directory holds
plan.json, log-<name>.out, metrics.jsonl, run.json (written by the engine), exit.json
(written by the launcher), the sbatch script, profile/ and checkpoints/.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import tempfile
import time
from pathlib import Path

from .errors import InputError
from .files import is_regular

PLAN_FILE = "plan.json"
METRICS_FILE = "metrics.jsonl"
RUN_FILE = "run.json"
EXIT_FILE = "exit.json"


class RootError(InputError):
    """An experiments root that cannot be used as given: one line naming it and the fix."""


def shown_path(path: str | Path) -> str:
    """A path as a message shows it: bytes that are not UTF-8 as \\xNN escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def checked_root(root: str | Path, what: str = "--root") -> Path:
    """root made absolute and resolved, or RootError before anything is created.

    Its bytes must be UTF-8: plan.json, run.json and the job history record paths as
    UTF-8 text, so a root they cannot spell would leave records that name no directory.
    A symlink loop has no directory at its end."""
    raw = os.fspath(root)
    try:
        os.fsencode(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise RootError(f"{what} {shown_path(raw)} is not valid UTF-8: trainbench records "
                        "experiment paths as UTF-8 text; pass a root whose name is UTF-8"
                        ) from None
    try:
        return Path(raw).expanduser().resolve()
    except (RuntimeError, OSError) as err:  # RuntimeError: Python < 3.13's symlink loop
        loop = isinstance(err, RuntimeError) or getattr(err, "errno", None) == errno.ELOOP
        why = "runs into a symlink loop" if loop else f"cannot be resolved ({err})"
        raise RootError(f"{what} {shown_path(raw)} {why}; pass a directory") from None


def default_root() -> Path:
    """$TRAINBENCH_ROOT, else the current directory (the seeds' $STAGE_PATH habit);
    RootError when it cannot be used (checked_root)."""
    if os.environ.get("TRAINBENCH_ROOT"):
        return checked_root(os.environ["TRAINBENCH_ROOT"], "TRAINBENCH_ROOT")
    return checked_root(".", "the current directory")


def experiments_root(cluster: dict | None = None) -> Path:
    """Where experiments and jobs.sqlite live: $TRAINBENCH_ROOT, else the cluster config's
    experiments_root, else the current directory; RootError when it cannot be used."""
    if os.environ.get("TRAINBENCH_ROOT"):
        return default_root()
    configured = (cluster or {}).get("experiments_root")
    if configured:
        return checked_root(str(configured), "the cluster config's experiments_root")
    return default_root()


def root_of_experiment(exp_dir: Path, cluster: dict | None = None) -> Path:
    """The root an experiment directory was made under (<root>/experiments/<name>/<dir>)."""
    exp_dir = Path(exp_dir).resolve()
    if len(exp_dir.parents) >= 3 and exp_dir.parents[1].name == "experiments":
        return exp_dir.parents[2]
    return experiments_root(cluster)


def write_run_record(exp_dir: str | Path, info: dict) -> None:
    """run.json written beside and renamed: a reader (or a full disk) never sees half."""
    path = Path(exp_dir) / RUN_FILE
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(info, indent=2))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def update_run_record(exp_dir: str | Path, fields: dict) -> None:
    """run.json with `fields` added or replaced, written atomically (write_run_record);
    OSError when it cannot be, leaving run.json as it was."""
    info = json.loads((Path(exp_dir) / RUN_FILE).read_text())
    info.update(fields)
    write_run_record(exp_dir, info)


def log_file_name(name: str) -> str:
    return f"log-{name}.out"


def creatable_problem(path: str | Path) -> str | None:
    """Why path (a directory or file to be made) cannot be created, or None; found without
    leaving anything behind."""
    where = Path(path)
    while not where.exists() and where != where.parent:
        if where.is_symlink():  # a link to nothing, or to itself: nothing can be made there
            return f"{shown_path(where)} is a symbolic link to nothing that exists"
        where = where.parent
    if not where.is_dir():
        return f"{where} is a file, not a directory"
    # access() answers yes to root on a read-only or pseudo file system (/proc): only a
    # real attempt tells, and the probe is removed at once.
    try:
        probe = tempfile.mkdtemp(dir=where, prefix=".trainbench-probe-")
    except OSError as err:
        return f"cannot create anything in {where} ({err.strerror})"
    os.rmdir(probe)
    return None


def root_problem(root: str | Path) -> str | None:
    """Why experiments cannot be created under root, or None; creates nothing, so a
    refused run leaves no trace."""
    problem = creatable_problem(Path(root) / "experiments")
    if problem:
        return (f"experiments root {root}: {problem}; pass --root (or TRAINBENCH_ROOT) "
                "naming a writable directory")
    return None


def new_experiment_dir(root: str | Path, name: str) -> Path:
    """Create a fresh directory for one run; an existing one is never overwritten.

    The timestamp has second resolution like the seeds' `date +%s`; runs started in the
    same second get a numeric suffix instead of sharing a directory.
    """
    return new_stamped_dir(Path(root) / "experiments" / name, name)


def new_stamped_dir(parent: Path, name: str) -> Path:
    """Create `<parent>/<name>_<timestamp>[-n]`, a name no earlier directory holds."""
    parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        candidate = parent / (f"{name}_{stamp}" + (f"-{n}" if n else ""))
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise RuntimeError(f"could not create a new directory under {parent}")


# --- the local launcher's identity ------------------------------------------------------------
# A launcher killed with SIGKILL writes no exit.json. It records its pid and the kernel's start
# time of that pid here, so `jobs` and `results` can tell a dead launcher from a live one (a
# recycled pid has another start time) and settle the run as failed.

LAUNCHER_FILE = "launcher.json"


def process_start_ticks(pid: int) -> int | None:
    """When process pid started (clock ticks since boot), None where it does not run."""
    try:
        with open(f"/proc/{int(pid)}/stat") as fh:
            stat = fh.read()
    except (OSError, ValueError):
        return None
    # The command name (field 2) may hold spaces and parentheses: count from its end.
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def write_launcher_record(exp_dir: str | Path) -> None:
    pid = os.getpid()
    record = {"pid": pid, "start_ticks": process_start_ticks(pid), "started": time.time()}
    (Path(exp_dir) / LAUNCHER_FILE).write_text(json.dumps(record))


def launcher_gone(exp_dir: str | Path) -> bool | None:
    """True when the run's recorded launcher no longer runs, False while it does, None when
    no launcher was recorded (a Slurm job, or a run older than this record)."""
    try:
        record = json.loads((Path(exp_dir) / LAUNCHER_FILE).read_text())
        pid = int(record["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ticks = process_start_ticks(pid)
    if ticks is None:
        return True
    return record.get("start_ticks") is not None and ticks != record["start_ticks"]


# --- the job history of a root (<root>/jobs.sqlite), as far as a run directory needs it ---------

DB_FILE = "jobs.sqlite"
# The job states of a run that has not ended (launch/jobs.py maps Slurm's states onto these).
ACTIVE = ("PENDING", "RUNNING")


def launcher_alive(pid: str | None, exp_dir: str | Path | None = None) -> bool:
    """Whether the local launcher that recorded a job still runs. Its launcher.json (pid
    and start time) decides where there is one; else a trainbench process with that pid
    (a recycled pid of another program does not count)."""
    if exp_dir is not None:
        gone = launcher_gone(exp_dir)
        if gone is not None:
            return not gone
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as fh:
            return b"trainbench" in fh.read()
    except (OSError, TypeError, ValueError):
        return False


def recorded_activity(exp_dir: str | Path) -> str | None:
    """PENDING or RUNNING when the job history of the experiment's root
    (<root>/experiments/<name>/<dir>) says the newest job of exp_dir is still queued or
    running, else None; a local job counts only while its launcher lives (one that died
    left its row behind). Read-only: the history is opened read-only (never created) and
    a lock is waited on for half a second at most."""
    try:
        resolved = Path(exp_dir).resolve()
    except (OSError, RuntimeError):
        return None
    if len(resolved.parents) < 3 or resolved.parents[1].name != "experiments":
        return None
    path = resolved.parents[2] / DB_FILE
    if not is_regular(path):
        return None
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=0.5)
        try:
            row = conn.execute("SELECT executor, job_id, state FROM jobs WHERE exp_dir IN (?, ?) "
                               "ORDER BY id DESC LIMIT 1",
                               (str(exp_dir), str(resolved))).fetchone()
        finally:
            conn.close()
    except (sqlite3.Error, UnicodeEncodeError):
        return None
    if row is None or row[2] not in ACTIVE:
        return None
    if row[0] != "slurm" and not launcher_alive(row[1], exp_dir):
        return None
    return row[2]
