"""Where experiments are and what a trainbench run directory says: finding experiments
under paths (regular files only), reading a run's records (plan.json, run.json,
exit.json), choosing its log, and telling whether its run is still going."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

from ..catalog import models
from ..files import MAX_RECORD_BYTES, describe_read_error, file_kind, is_regular, read_bounded
from ..overrides import MAX_INT
from ..plan import Plan
from ..rundir import EXIT_FILE, METRICS_FILE, PLAN_FILE, RUN_FILE, launcher_gone, recorded_activity

LOG_SUFFIXES = (".out", ".log")


# --- finding experiments ------------------------------------------------------------------

def is_experiment_dir(path: Path) -> bool:
    return (path / PLAN_FILE).is_file() or (path / METRICS_FILE).is_file()


def is_main_log(path: Path) -> bool:
    """The seeds and trainbench name a run's main log `log-<name>.out`."""
    return path.name.startswith("log-") and path.suffix in LOG_SUFFIXES


def find_experiments(paths: list[str | Path],
                     skipped: list[str] | None = None) -> list[tuple[Path, bool]]:
    """Experiments under the given paths, as (path, certain) pairs in a stable order.

    A directory with plan.json or metrics.jsonl is one experiment (not descended into);
    a `log-*.out` file is one; another *.out/*.log file is one only if it holds step
    lines, which the caller learns by parsing it (certain=False). A file named on the
    command line is always an experiment. Only regular files are logs: a FIFO, device or
    socket never ends, so it is not read, and a line saying so goes to `skipped` (as does
    a directory that cannot be listed). FileNotFoundError for a path that does not exist.
    """
    found: list[tuple[Path, bool]] = []
    seen: set[Path] = set()
    skipped = skipped if skipped is not None else []

    def add(p: Path, certain: bool) -> None:
        try:
            key = p.resolve()
        except (OSError, RuntimeError):  # a symlink loop: no file at its end
            skipped.append(f"{p}: a symbolic link loop, not read")
            return
        if key not in seen:
            seen.add(key)
            found.append((p, certain))

    def unlisted(err: OSError) -> None:
        skipped.append(f"{err.filename}: cannot be listed ({err.strerror}), not read")

    for raw in paths:
        top = Path(raw)
        if not top.exists():
            raise FileNotFoundError(f"{top} does not exist")
        if is_regular(top):
            add(top.parent if is_experiment_dir(top.parent) else top, True)
            continue
        if not top.is_dir():
            skipped.append(not_regular(top))
            continue
        for root, dirs, files in os.walk(top, onerror=unlisted):
            here = Path(root)
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            if is_experiment_dir(here):
                add(here, True)
                dirs[:] = []
                continue
            for name in sorted(files):
                p = here / name
                if p.suffix not in LOG_SUFFIXES:
                    continue
                if is_regular(p):
                    add(p, is_main_log(p))
                else:
                    skipped.append(not_regular(p))
    return found


def not_regular(path: Path, label: str | None = None) -> str:
    """The line that says why a path named like a log was not read (labelled `label`,
    else by the path)."""
    label = label or str(path)
    try:
        kind = file_kind(path.stat().st_mode)
    except OSError as err:
        return f"{label}: cannot be read ({err.strerror}), not read"
    return f"{label}: {kind}, not a regular file, not read"


# --- reading a trainbench run directory -------------------------------------------------------

@dataclass
class RunFacts:
    """What the trainbench files of a run directory say (all optional)."""

    plan: dict | None = None
    parsed_plan: Plan | None = None
    """plan.json as this trainbench's Plan, where it reads as one and its model's sizes
    are a model's (predict's figures come from it)."""
    model: models.ModelSpec | None = None
    model_refused: bool = False
    """plan.json's model has sizes no model has: no FLOPs count, not even the catalog's."""
    run: dict | None = None
    exit: dict | None = None


def read_json(path: Path, notes: list[str]) -> dict | None:
    """A run record as a dict; None with a note when it is absent, not a regular file, too
    large, not JSON or not an object. Nothing here ends the summary."""
    if not path.exists():
        return None
    try:
        data = json.loads(read_bounded(path, MAX_RECORD_BYTES))
    except OSError as err:
        notes.append(f"{path.name} unreadable: {describe_read_error(err)}")
        return None
    except RecursionError:
        notes.append(f"{path.name} unreadable: nested too deeply")
        return None
    except ValueError as err:
        notes.append(f"{path.name} unreadable: {str(err).splitlines()[0][:200]}")
        return None
    if not isinstance(data, dict):
        notes.append(f"{path.name} is not a JSON object")
        return None
    return data


POSITIVE_SIZES = ("vocab_size", "hidden", "ffn", "layers", "heads", "kv_heads", "head_dim",
                  "seq_len")


def model_size_problem(spec: models.ModelSpec) -> str | None:
    """Why a plan.json's model has sizes no model has (a negative width, zero heads, a
    count past MAX_INT, `--set`'s bound), or None. Its FLOPs and predict's figures would be nonsense:
    a negative TFLOPS, a division by zero, an integer beyond a float."""
    for f in fields(spec):
        value = getattr(spec, f.name)
        if f.type != "int":
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            return f"{f.name} = {str(value)[:20]!r}"
        low = 1 if f.name in POSITIVE_SIZES else 0
        if not low <= value <= MAX_INT:
            shown = str(value) if len(str(value)) <= 20 else f"a number of {len(str(value))} digits"
            return f"{f.name} = {shown}"
    return None


def read_run_dir(directory: Path, notes: list[str]) -> RunFacts:
    facts = RunFacts()
    facts.plan = read_json(directory / PLAN_FILE, notes)
    if facts.plan is not None:
        try:
            facts.parsed_plan = Plan.from_dict(dict(facts.plan))
            facts.model = facts.parsed_plan.model
        except (TypeError, KeyError, ValueError, AttributeError):
            # A plan written by another trainbench version: the catalog still knows the model.
            try:
                spec = models.get_model(facts.plan["workload"], facts.plan["size"])
                layers = facts.plan.get("model", {}).get("layers")
                facts.model = spec.with_layers(layers) if layers and not spec.is_hybrid else spec
            except (LookupError, KeyError):
                notes.append("plan.json names a model this trainbench does not know")
    problem = model_size_problem(facts.model) if facts.model is not None else None
    if problem:
        notes.append(f"plan.json's model has sizes no model has ({problem}): no FLOPs count "
                     "or prediction from it")
        facts.model, facts.parsed_plan, facts.model_refused = None, None, True
    facts.run = read_json(directory / RUN_FILE, notes)
    facts.exit = read_json(directory / EXIT_FILE, notes)
    return facts


def run_dir_log(directory: Path, plan: dict | None, notes: list[str]) -> Path | None:
    """The run's log: the one its plan names, else the first log-*.out, else any log.
    Only regular files are logs; one that is not (a FIFO) is named in the notes."""
    candidates = sorted(p for p in directory.iterdir() if p.suffix in LOG_SUFFIXES)
    for p in candidates:
        if not is_regular(p) and p.exists():
            notes.append(not_regular(p, p.name))
    logs = [p for p in candidates if is_regular(p)]
    if plan and isinstance(plan.get("name"), str):
        named = directory / f"log-{plan['name']}.out"
        if named in logs:
            return named
    mains = [p for p in logs if is_main_log(p)]
    return (mains or logs or [None])[0]


def experiment_name(path: Path) -> str:
    if path.is_dir():
        return path.name
    stem = path.stem
    return stem[4:] if stem.startswith("log-") else stem


def still_running(directory: Path) -> str | None:
    """Why a run directory without exit.json belongs to a run that has not ended, or None:
    its recorded local launcher still runs, or (no launcher recorded: a Slurm job) the job
    history says the job is queued or running."""
    gone = launcher_gone(directory)
    if gone is False:
        return "its launcher is still running"
    if gone is None:
        state = recorded_activity(directory)
        if state is not None:
            return f"the job history says {state}"
    return None
