"""Bulk sweeps: one YAML file expands into many runs, like the seeds' launcher loops.

    executor: slurm                 # optional; `--executor` wins
    defaults:                       # optional; merged into every task
      gpu: h100
      steps: 50
      env: {NCCL_DEBUG: WARN}
      slurm: {time_limit: "01:00:00"}
    tasks:
      - workload: pretrain_llama3.1
        sizes: [8b, 70b]            # size: 8b also works; likewise dtype(s), scale(s)
        dtypes: [bf16, fp8]
        scales: [64, 128]
        repeats: 3
        set: [mbs=1]                # --set overrides for this task
        env: {NCCL_ALGO: Ring}

Each task is the product workloads x sizes x dtypes x scales x repeats. Every run is
planned (build_plan) and checked before anything is launched, so a typo in task 7 does
not leave tasks 1-6 running. Local runs go one after another through `trainbench run`;
Slurm runs are all submitted at once, each its own job and experiment directory.
"""

from __future__ import annotations

import itertools
import math
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..files import NotRegularFile, TooLarge, YAMLBoundError, brief, load_yaml, read_bounded
from ..overrides import parse_overrides
from ..plan import Plan, PlanError
from ..planning import build_plan
from ..rundir import root_problem as unusable
from .jobs import JobsDB, JobsDBError
from .local import disk_space_problem
from .sbatch import submit_plan
from .slurm import SlurmOptions, check_env, check_options, missing_settings

EXECUTORS = ("local", "slurm")
# Bounds on what one file can expand to: the runs are listed (and planned) up front, so a
# typo in repeats would otherwise hang the command building a billion tasks.
MAX_REPEATS = 1000
MAX_RUNS = 10_000
_LIST_KEYS = {"workload": "workloads", "size": "sizes", "dtype": "dtypes", "scale": "scales"}
_TASK_KEYS = {*(_LIST_KEYS), *(_LIST_KEYS.values()), "repeats", "steps", "gpu", "gpus_per_node",
              "set", "env", "slurm"}
_SLURM_KEYS = {"account", "partition", "time_limit", "nodelist", "exclude", "reservation",
               "exclusive", "gres", "extra_args"}


@dataclass(frozen=True)
class BulkTask:
    """One run of the sweep."""
    index: int
    """1-based position in the expanded sweep."""
    source: int
    """1-based number of the `tasks:` entry it came from."""
    workload: str
    size: str
    dtype: str
    scale: int
    repeat: int
    """1-based repeat number."""
    steps: int | None
    gpu: str
    gpus_per_node: int | None
    settings: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    slurm: dict = field(default_factory=dict, compare=False)

    def label(self) -> str:
        return (f"task {self.index} ({self.workload} {self.size} {self.dtype} x{self.scale}"
                f", repeat {self.repeat})")

    def where(self) -> str:
        """Names the run in a problem; repeats share it, so a problem is said once."""
        return f"tasks[{self.source}] {self.workload} {self.size} {self.dtype} x{self.scale}"

    def run_command(self, executor: str) -> list[str]:
        """The equivalent `trainbench run` command line (what a local sweep executes)."""
        cmd = ["trainbench", "run", "-w", self.workload, "-s", self.size, "--dtype", self.dtype,
               "--scale", str(self.scale), "--gpu", self.gpu, "--executor", executor]
        if self.steps is not None:
            cmd += ["--steps", str(self.steps)]
        if self.gpus_per_node is not None:
            cmd += ["--gpus-per-node", str(self.gpus_per_node)]
        for item in self.settings:
            cmd += ["--set", item]
        for key, value in self.env:
            cmd += ["--env", f"{key}={value}"]
        return cmd


def load_sweep(path: str | Path) -> dict:
    """The YAML mapping of a sweep file; PlanError naming the problem."""
    p = Path(path)
    try:
        data = load_yaml(read_bounded(p).decode("utf-8"))
    except UnicodeDecodeError:
        raise PlanError([f"bulk file {p} is not a text file; give a YAML sweep file "
                         "(see `trainbench bulk --help`)"]) from None
    except (NotRegularFile, TooLarge) as err:
        raise PlanError([f"bulk file {err}; give a YAML sweep file"]) from None
    except OSError as err:
        raise PlanError([f"cannot read bulk file {p}: {err.strerror}"]) from None
    except YAMLBoundError as err:
        raise PlanError([f"bulk file {p} is refused: {err}"]) from None
    except yaml.YAMLError as err:
        raise PlanError([f"bulk file {p} is not valid YAML: {str(err).splitlines()[0]}"]) from None
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), list) or not data["tasks"]:
        raise PlanError([f"bulk file {p} needs a non-empty `tasks:` list "
                         "(see `trainbench bulk --help`)"])
    unknown = set(data) - {"executor", "defaults", "tasks"}
    if unknown:
        raise PlanError([f"bulk file {p}: unknown top-level keys {', '.join(sorted(unknown))}; "
                         "use executor, defaults, tasks"])
    return data


def _axis_problem(single: str, values: list) -> str | None:
    """Why the values of one axis (workload, size, dtype: names; scale: integers) are not
    what a sweep takes; None when they are. Nothing is formatted whole (files.brief)."""
    for value in values:
        if single == "scale":
            if not isinstance(value, int) or isinstance(value, bool):
                return f"scale {brief(value)} must be an integer (the number of ranks)"
        elif not isinstance(value, str) or not value or len(value) > 100:
            return f"{single} {brief(value)} must be a name, e.g. {_EXAMPLES[single]}"
    return None


_EXAMPLES = {"workload": "pretrain_llama3.1", "size": "8b", "dtype": "bf16"}


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _as_settings(value, where: str, problems: list[str]) -> list[str]:
    if value is None:
        return []
    items = _as_list(value)
    if not all(isinstance(i, str) for i in items):
        problems.append(f"{where}: `set` must be a list of KEY=VALUE strings")
        return []
    return items


def _as_env(value, where: str, problems: list[str]) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{where}: `env` must be a mapping of NAME: value")
        return {}
    out = {}
    for key, val in value.items():
        if isinstance(val, bool):
            val = "true" if val else "false"
        elif isinstance(val, (int, float)):
            val = str(val)
        out[str(key)] = val
    return out


def _merge(defaults: dict, task: dict, where: str, problems: list[str]) -> dict:
    merged = {**defaults, **task}
    # A task's own `set` replaces the defaults' value of each key it names (a key given
    # twice in one list is refused by parse_overrides).
    own = _as_settings(task.get("set"), where, problems)
    named = {part.partition("=")[0].strip().lower() for item in own for part in item.split()}
    merged["set"] = [part for item in _as_settings(defaults.get("set"), "defaults", problems)
                     for part in item.split()
                     if part.partition("=")[0].strip().lower() not in named] + own
    merged["env"] = {**_as_env(defaults.get("env"), "defaults", problems),
                     **_as_env(task.get("env"), where, problems)}
    slurm = {}
    for source, label in ((defaults.get("slurm"), "defaults"), (task.get("slurm"), where)):
        if source is None:
            continue
        if not isinstance(source, dict):
            problems.append(f"{label}: `slurm` must be a mapping")
            continue
        unknown = set(source) - _SLURM_KEYS
        if unknown:
            problems.append(f"{label}: unknown slurm keys {', '.join(sorted(unknown))}; "
                            f"known: {', '.join(sorted(_SLURM_KEYS))}")
        if "time_limit" in source and not isinstance(source["time_limit"], str):
            # YAML reads an unquoted 01:00:00 as the number 3600 (base 60).
            problems.append(f"{label}: slurm time_limit must be quoted, e.g. "
                            "time_limit: '01:00:00'")
        if "exclusive" in source and not isinstance(source["exclusive"], bool):
            problems.append(f"{label}: slurm exclusive must be true or false")
        extra = source.get("extra_args", [])
        if not isinstance(extra, (list, str)) or (
                isinstance(extra, list) and not all(isinstance(a, str) for a in extra)):
            problems.append(f"{label}: slurm extra_args must be a list of --option=value")
        slurm.update(source)
    merged["slurm"] = slurm
    return merged


def expand(data: dict, cluster: dict, executor: str,
           local_gpu: str | None = None) -> list[BulkTask]:
    """Every run of the sweep, in order; PlanError listing every problem in the file.

    The GPU type of a run is its task's `gpu`, else the cluster config's gpu_type, else
    (local runs only) `local_gpu`, the type detected on this machine.
    """
    problems: list[str] = []
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise PlanError(["bulk file: `defaults` must be a mapping"])
    tasks: list[BulkTask] = []
    loose = [n for n, raw in enumerate(data["tasks"], 1) if not isinstance(raw, dict)]
    if loose:  # one line for all of them: `tasks: [1, 2, 3]` is one mistake
        shown = ", ".join(f"tasks[{n}]" for n in loose[:5]) + (" ..." if len(loose) > 5 else "")
        problems.append(f"{shown}: each task must be a mapping (workload:, sizes:, ...), "
                        "not a single value")
    for n, raw in enumerate(data["tasks"], 1):
        where = f"tasks[{n}]"
        if not isinstance(raw, dict):
            continue
        for source, label in ((defaults, "defaults"), (raw, where)):
            unknown = set(source) - _TASK_KEYS
            if unknown and (label != "defaults" or n == 1):
                problems.append(f"{label}: unknown keys {', '.join(sorted(unknown))}; "
                                f"known: {', '.join(sorted(_TASK_KEYS))}")
        task = _merge(defaults, raw, where, problems)
        axes = []
        for single, plural in _LIST_KEYS.items():
            if single in task and plural in task:
                problems.append(f"{where}: give {single} or {plural}, not both")
            values = _as_list(task.get(plural, task.get(single)))
            if values == [None]:
                problems.append(f"{where}: missing {single} (or {plural}: [...])")
            elif (bad := _axis_problem(single, values)) is not None:
                problems.append(f"{where}: {bad}")
                values = [None]
            axes.append(values)
        repeats = task.get("repeats", 1)
        if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
            problems.append(f"{where}: repeats must be a positive integer")
            repeats = 1
        elif repeats > MAX_REPEATS:
            problems.append(f"{where}: repeats {repeats} is more than {MAX_REPEATS}; a sweep "
                            "repeats each run a few times")
            repeats = 1
        steps = task.get("steps")
        gpus_per_node = task.get("gpus_per_node", cluster.get("gpus_per_node"))
        for name, value in (("steps", steps), ("gpus_per_node", gpus_per_node)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 1):
                problems.append(f"{where}: {name} must be a positive integer")
        gpu = task.get("gpu") or cluster.get("gpu_type") or (
            local_gpu if executor == "local" else None)
        if not gpu:
            problems.append(f"{where}: no GPU type; add `gpu: h100` (for example) to the "
                            "task or defaults, or run `trainbench init --gpu-type ...`")
            continue
        if any(v == [None] for v in axes):
            continue
        runs = math.prod(len(a) for a in axes) * repeats
        if len(tasks) + runs > MAX_RUNS:
            problems.append(f"{where}: the sweep grows to more than {MAX_RUNS:,} runs; "
                            "split it into several files")
            break
        for workload, size, dtype, scale in itertools.product(*axes):
            for repeat in range(1, repeats + 1):
                tasks.append(BulkTask(
                    index=len(tasks) + 1, source=n, workload=str(workload), size=str(size),
                    dtype=str(dtype), scale=scale, repeat=repeat, steps=steps, gpu=str(gpu),
                    gpus_per_node=gpus_per_node, settings=tuple(task["set"]),
                    env=tuple(sorted(task["env"].items())), slurm=dict(task["slurm"])))
    if problems:
        raise PlanError(problems)
    return tasks


def plan_task(task: BulkTask) -> Plan:
    """The validated plan of one task; PlanError with lines prefixed by the task."""
    try:
        if not isinstance(task.scale, int) or isinstance(task.scale, bool):
            raise PlanError([f"scale {brief(task.scale)} must be an integer"])
        return build_plan(task.workload, task.size, task.dtype, task.scale, task.gpu,
                          overrides=parse_overrides(list(task.settings)),
                          steps=task.steps if task.steps is not None else 50,
                          gpus_per_node=task.gpus_per_node, env=dict(task.env))
    except PlanError as err:
        raise PlanError([f"{task.where()}: {p}" for p in err.problems]) from None


def slurm_options(task: BulkTask):
    s = task.slurm
    extra = s.get("extra_args") or ()
    return SlurmOptions(
        account=s.get("account"), partition=s.get("partition"),
        time_limit=str(s.get("time_limit", "00:30:00")), nodelist=s.get("nodelist"),
        exclude=s.get("exclude"), reservation=s.get("reservation"),
        exclusive=bool(s.get("exclusive", True)), gres=s.get("gres"),
        extra_args=tuple(extra) if isinstance(extra, (list, tuple)) else (extra,))


def validate(tasks: list[BulkTask], cluster: dict, executor: str) -> list[Plan]:
    """Plan every task (and check its Slurm options); PlanError listing all problems."""
    problems: list[str] = []
    plans: list[Plan] = []
    for task in tasks:
        try:
            plan = plan_task(task)
            if executor == "slurm":
                check_options(plan, slurm_options(task), cluster)
            else:
                # A local run's env goes into plan.json and the job record: the same
                # rules as for a job script (names, one line, no secrets).
                bad = check_env(task.env, "env")
                if bad:
                    raise PlanError(bad)
        except PlanError as err:
            problems += [p if p.startswith("tasks[") else f"{task.where()}: {p}"
                         for p in err.problems]
            continue
        plans.append(plan)
    if problems:
        # Repeats of a run share their problems: each is said once, in order.
        raise PlanError(list(dict.fromkeys(problems)))
    return plans


def root_problem(root: Path, executor: str) -> str | None:
    """Why the sweep's runs cannot be recorded under root (the checks `run` makes before
    it creates anything, made once for the sweep), or None."""
    problem = unusable(root) or disk_space_problem(root)
    if problem is None and executor == "local":
        try:
            JobsDB.check(root)
        except JobsDBError as err:
            problem = str(err)
    return problem


def run_local_sweep(tasks: list[BulkTask], echo=print,
                    root: Path | None = None) -> list[tuple[BulkTask, int]]:
    """Run each task with `trainbench run --executor local`, one after another, under
    root (default: the one `run` finds itself).

    A failed run does not stop the sweep; the exit code of each is returned.
    """
    results = []
    for task in tasks:
        cmd = task.run_command("local") + (["--root", str(root)] if root is not None else [])
        echo(f"== {task.label()}: {shlex.join(cmd)}")
        argv = [sys.executable, "-m", "trainbench.cli", *cmd[1:]]
        code = subprocess.run(argv).returncode
        results.append((task, code))
    return results


def warn_missing_settings(tasks: list[BulkTask], plans: list[Plan], cluster: dict) -> None:
    """Each distinct missing-settings warning of the sweep's jobs, once, on stderr."""
    lines = {missing_settings(plan, slurm_options(task), cluster)
             for task, plan in zip(tasks, plans)}
    for line in sorted(line for line in lines if line):
        print(line, file=sys.stderr)


def submit_slurm_sweep(tasks: list[BulkTask], plans: list[Plan], root: Path, cluster: dict,
                       echo=print) -> list[tuple[BulkTask, Path, str]]:
    """Submit every task as its own Slurm job; stops at the first sbatch refusal."""
    warn_missing_settings(tasks, plans, cluster)
    submitted = []
    for task, plan in zip(tasks, plans):
        exp_dir, job_id = submit_plan(plan, root, slurm_options(task), cluster, warn=False)
        echo(f"{task.label()}: Slurm job {job_id}, {exp_dir}")
        submitted.append((task, exp_dir, job_id))
    return submitted
