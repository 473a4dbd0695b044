"""`trainbench init`, `trainbench bulk` and `trainbench jobs`: cluster configuration,
sweeps and the job history. Heavy imports stay inside the command bodies."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
import yaml
from rich.table import Table

from ..config import config_path, load_config, save_config
from ..console import console, fail
from ..files import (NotRegularFile, TooLarge, YAMLBoundError, describe_read_error, load_yaml,
                     read_bounded, tail_lines)
from ..plan import PlanError
from ..rundir import DB_FILE, EXIT_FILE, RootError, checked_root, experiments_root, log_file_name
from . import bulk
from .jobs import JobsDB, JobsDBError, refresh, settle_local_jobs
from .request import detect_gpu_type
from .sbatch import render_sbatch, sbatch_output_name, script_name
from .slurm import (CONFIG_KEYS, SlurmError, SubmitError, check_cluster_config, detect_cluster,
                    parse_env_items)

# Square brackets are escaped for rich, which renders the help; the last paragraph is one
# line because rich keeps the line breaks of a docstring.
BULK_HELP = r"""Run a sweep from a YAML file: workloads x sizes x dtypes x scales x repeats.

A sweep file:
    executor: slurm            # or local; --executor wins
    defaults: {gpu: h100, steps: 50, env: {NCCL_DEBUG: WARN}}
    tasks:
      - workload: pretrain_llama3.1
        sizes: \[8b, 70b]
        dtypes: \[bf16, fp8]
        scales: \[64, 128]
        repeats: 3
        set: \[mbs=1]           # recipe overrides, as --set
        env: {NCCL_ALGO: Ring}
        slurm: {time_limit: "01:00:00", partition: batch}

""" + ("Every run is planned and checked before anything starts. Local runs go one after "
       "another through `trainbench run`; on Slurm each run is its own job.")


def _fail_problems(problems: list[str]) -> None:
    for problem in problems:
        typer.echo(f"trainbench: error: {problem}", err=True)
    raise typer.Exit(2)


def _load_cluster(check: bool = True) -> dict:
    try:
        return load_config(check=check)
    except ValueError as err:
        fail(str(err))


def _root(root: Optional[Path], cluster: dict) -> Path:
    """The experiments root (--root, TRAINBENCH_ROOT, the config's, or .); one line and
    exit 2 when it cannot be used (experiment.checked_root)."""
    try:
        return checked_root(root, "--root (or TRAINBENCH_ROOT)") if root else \
            experiments_root(cluster)
    except RootError as err:
        fail(str(err))


# --- init -----------------------------------------------------------------------------------
def _config_from_file(path: Path) -> dict:
    """A YAML file in the cluster config's own shape, or flat (account:, partition:, ...)."""
    try:
        data = load_yaml(read_bounded(path).decode("utf-8")) or {}
    except UnicodeDecodeError:
        fail(f"--from {path} is not a text file; give a YAML file (see `trainbench init --help`)")
    except (NotRegularFile, TooLarge) as err:
        fail(f"--from {err}; give a YAML file")
    except OSError as err:
        fail(f"cannot read --from {path}: {err.strerror}")
    except YAMLBoundError as err:
        fail(f"--from {path} is refused: {err}")
    except yaml.YAMLError as err:
        fail(f"--from {path} is not valid YAML: {str(err).splitlines()[0]}")
    if not isinstance(data, dict):
        fail(f"{path} must be a YAML mapping")
    data = dict(data)
    slurm = dict(data.pop("slurm", None) or {})
    for key in ("account", "partition", "gres", "extra_args"):
        if key in data:
            slurm[key] = data.pop(key)
    if "slurm_args" in data:
        slurm["extra_args"] = data.pop("slurm_args")
    unknown = set(data) - set(CONFIG_KEYS)
    if unknown:
        fail(f"{path}: unknown keys {', '.join(sorted(unknown))}; known: account, partition, "
             "gres, extra_args, gpu_type, gpus_per_node, experiments_root, env")
    if slurm:
        data["slurm"] = slurm
    return data


def _prompt_config(current: dict, detected: dict) -> dict:
    """Ask for each key; Enter keeps the default shown (current config, else detected)."""
    slurm = dict(current.get("slurm") or {})

    def ask(label: str, default, hint: str = ""):
        shown = "" if default is None else str(default)
        answer = typer.prompt(f"{label}{hint}", default=shown, show_default=True)
        return answer.strip() or None

    if detected.get("accounts"):
        typer.echo(f"accounts (sacctmgr): {', '.join(detected['accounts'])}")
    if detected.get("partitions"):
        typer.echo(f"partitions (sinfo): {', '.join(detected['partitions'])}")
    slurm["account"] = ask("Slurm account", slurm.get("account") or detected.get("account"),
                           " (empty: none)")
    slurm["partition"] = ask("GPU partition",
                             slurm.get("partition") or detected.get("partition"))
    gpu_type = ask("GPU type (h100, b200, ..., cpu)",
                   current.get("gpu_type") or detected.get("gpu_type") or "h100")
    per_node = ask("GPUs per node", current.get("gpus_per_node")
                   or detected.get("gpus_per_node") or 8)
    slurm["gres"] = ask("GRES per node", slurm.get("gres") or detected.get("gres"),
                        " (e.g. gpu:8; empty: none)")
    extra = ask("Extra sbatch arguments", " ".join(slurm.get("extra_args") or []) or None,
                " (e.g. --qos=high; empty: none)")
    root = ask("Experiments root", current.get("experiments_root") or str(Path.cwd()))
    env_now = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in (current.get("env") or {}).items())
    env_line = ask("Job environment", env_now or None, " (K=V separated by spaces; empty: none)")
    out = dict(current)
    out["slurm"] = {k: v for k, v in slurm.items() if v}
    if extra:
        out["slurm"]["extra_args"] = extra.split()
    out["gpu_type"] = gpu_type.lower() if gpu_type else None
    try:
        out["gpus_per_node"] = int(per_node) if per_node else None
    except ValueError:
        out["gpus_per_node"] = per_node  # reported by the validation that follows
    out["experiments_root"] = root
    out["env"] = parse_env_items(shlex.split(env_line), "environment") if env_line else {}
    return out


def _merged_config(current: dict, detected: dict, from_file: Path | None, *, account, partition,
                   gres, slurm_args, gpu_type, gpus_per_node, experiments_root, env) -> dict:
    """The config init writes without asking: the current one, what Slurm reports where
    the current one is silent, then --from FILE, then the options."""
    data = dict(current)
    slurm = dict(data.get("slurm") or {})
    for key in ("account", "partition", "gres"):
        if slurm.get(key) is None and detected.get(key):
            slurm[key] = detected[key]
    for key in ("gpu_type", "gpus_per_node"):
        if data.get(key) is None and detected.get(key) is not None:
            data[key] = detected[key]
    data["slurm"] = slurm
    if from_file is not None:
        loaded = _config_from_file(from_file)
        data["slurm"] = {**data["slurm"], **(loaded.pop("slurm", None) or {})}
        data.update(loaded)
    flags = {"account": account, "partition": partition, "gres": gres}
    data["slurm"].update({k: v for k, v in flags.items() if v is not None})
    if slurm_args:
        data["slurm"]["extra_args"] = list(slurm_args)
    if gpu_type is not None:
        data["gpu_type"] = gpu_type.lower()
    if gpus_per_node is not None:
        data["gpus_per_node"] = gpus_per_node
    if experiments_root is not None:
        data["experiments_root"] = str(experiments_root)
    if env:
        try:
            data["env"] = {**(data.get("env") or {}), **parse_env_items(env)}
        except SlurmError as err:
            _fail_problems(err.problems)
    return data


def init_command(
    account: Optional[str] = typer.Option(None, "--account", help="Slurm account (-A)."),
    partition: Optional[str] = typer.Option(None, "--partition", help="GPU partition (-p)."),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", help="GPUs per node."),
    gpu_type: Optional[str] = typer.Option(None, "--gpu-type", help="h100, b200, ... or cpu."),
    gres: Optional[str] = typer.Option(None, "--gres", help="GRES per node, e.g. gpu:8."),
    experiments_root: Optional[Path] = typer.Option(
        None, "--experiments-root", help="Where experiments/ and jobs.sqlite live."),
    env: List[str] = typer.Option([], "--env", help="K=V for every job (repeatable)."),
    slurm_args: List[str] = typer.Option([], "--slurm-arg",
                                         help="Extra sbatch argument for every job (repeatable)."),
    from_file: Optional[Path] = typer.Option(None, "--from", help="Read the settings from YAML."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not prompt; take detected defaults."),
):
    """Write the cluster config: Slurm account, partition, GPUs, job environment.

    With no options on a terminal it asks, offering defaults read from sinfo and
    sacctmgr; with options, --from FILE or --yes it asks nothing (for scripts and CI).
    Secrets such as HF_TOKEN are refused: export them in your shell instead.
    """
    # Unchecked: a wrongly typed value in the current config is what init may be fixing.
    current = _load_cluster(check=False)
    given = any(v is not None for v in (account, partition, gpus_per_node, gpu_type, gres,
                                        experiments_root)) or env or slurm_args
    interactive = sys.stdin.isatty() and not (yes or given or from_file)
    if not interactive and not (yes or given or from_file):
        fail("no terminal to ask on: pass the settings as options (--account, --partition, "
             "--gpu-type, --gpus-per-node, --gres, --experiments-root, --env), --from FILE, "
             "or --yes to take the values detected from Slurm")
    if experiments_root is not None:
        where = experiments_root.expanduser().absolute()
        parts = [where, *where.parents]
        blocking = next((p for p in parts if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            fail(f"--experiments-root {experiments_root}: {blocking} is a file, not a directory")
    detected = detect_cluster()
    if interactive:
        try:
            data = _prompt_config(current, detected)
        except SlurmError as err:
            _fail_problems(err.problems)
    else:
        data = _merged_config(current, detected, from_file, account=account,
                              partition=partition, gres=gres, slurm_args=slurm_args,
                              gpu_type=gpu_type, gpus_per_node=gpus_per_node,
                              experiments_root=experiments_root, env=env)
    if data.get("experiments_root"):
        root_dir = os.path.expanduser(str(data["experiments_root"]))
        data["experiments_root"] = os.path.abspath(root_dir)
    data["slurm"] = {k: v for k, v in (data.get("slurm") or {}).items() if v not in (None, "", [])}
    data = {k: v for k, v in data.items() if not (k in CONFIG_KEYS and v in (None, {}, ""))}
    problems = check_cluster_config(data)
    if problems:
        _fail_problems(problems)
    if not data:
        fail("nothing to write: no Slurm settings were detected on this machine and none "
             "were given; pass --account, --partition, --gpu-type, --gpus-per-node or "
             "--experiments-root")
    try:
        path = save_config(data)
    except ValueError as err:
        fail(str(err))
    typer.echo(f"wrote {path}")
    mine = {k: data[k] for k in CONFIG_KEYS if k in data}
    typer.echo(yaml.safe_dump(mine, sort_keys=True).rstrip())
    if path != config_path():
        typer.echo(f"note: $TRAINBENCH_CONFIG points elsewhere ({config_path()})")


# --- bulk -----------------------------------------------------------------------------------
def bulk_command(
    file: Path = typer.Argument(..., help="The sweep, a YAML file."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Plan and list every run; launch none."),
    executor: Optional[str] = typer.Option(
        None, "--executor", help="local or slurm (default: the file's, else local)."),
    root: Optional[Path] = typer.Option(None, "--root", envvar="TRAINBENCH_ROOT",
                                        help="Where experiments/ and the job history live "
                                             "(default: the cluster config's, else .)."),
):
    cluster = _load_cluster()
    try:
        data = bulk.load_sweep(file)
    except PlanError as err:
        _fail_problems(err.problems)
    executor = executor or data.get("executor") or "local"
    if executor not in bulk.EXECUTORS:
        fail(f"unknown executor {executor!r}; use local or slurm")
    local_gpu = None
    if executor == "local":
        local_gpu = detect_gpu_type()[0] or None
    try:
        tasks = bulk.expand(data, cluster, executor, local_gpu)
        plans = bulk.validate(tasks, cluster, executor)
    except PlanError as err:
        _fail_problems(err.problems)
    where = _root(root, cluster)
    if not dry_run:
        # Where every run of the sweep is recorded, checked once before any starts (as
        # `run` checks it): a root that is a file must not fail each run on its own line.
        problem = bulk.root_problem(where, executor)
        if problem:
            fail(problem)

    out = console()
    out.print(_sweep_table(f"{file.name}: {len(tasks)} run(s) on {executor}", tasks, plans))
    if dry_run:
        if executor == "local":
            for task in tasks:
                typer.echo(shlex.join(task.run_command("local")))
        else:
            first = plans[0]
            where = where / "experiments" / first.name / f"{first.name}_DRYRUN"
            bulk.warn_missing_settings(tasks, plans, cluster)
            typer.echo("# job script of run 1 (the others differ only in their plan):")
            typer.echo(render_sbatch(first, where, bulk.slurm_options(tasks[0]), cluster), nl=False)
        typer.echo(f"dry run: {len(tasks)} run(s) planned, nothing launched")
        return
    if executor == "local":
        results = bulk.run_local_sweep(tasks, echo=typer.echo, root=where)
        failed = [(t, c) for t, c in results if c != 0]
        typer.echo(f"bulk: {len(results)} run(s), {len(results) - len(failed)} succeeded, "
                   f"{len(failed)} failed")
        for task, code in failed:
            typer.echo(f"  {task.label()}: exit code {code}")
        if failed:
            raise typer.Exit(1)
        return
    submitted: list = []
    try:
        bulk.submit_slurm_sweep(tasks, plans, where, cluster,
                                echo=lambda line: (submitted.append(line), typer.echo(line)))
    except SubmitError as err:
        fail(f"run {len(submitted) + 1} was not submitted: {err}; "
             f"{len(submitted)} earlier run(s) were (see `trainbench jobs`)", code=1)
    typer.echo(f"bulk: submitted {len(submitted)} Slurm job(s); follow them with "
               "`trainbench jobs refresh`")


bulk_command.__doc__ = BULK_HELP


def _sweep_table(title: str, tasks: list, plans: list):
    table = Table(title=title)
    for col in ("#", "workload", "size", "dtype", "ranks", "repeat", "layout", "nodes", "steps"):
        table.add_column(col)
    for task, plan in zip(tasks, plans):
        table.add_row(str(task.index), task.workload, task.size, task.dtype, str(task.scale),
                      str(task.repeat), plan.layout.describe(), str(plan.num_nodes),
                      str(plan.steps))
    return table


# --- jobs -----------------------------------------------------------------------------------

ROOT_OPT = typer.Option(None, "--root", envvar="TRAINBENCH_ROOT",
                        help="Experiments root holding jobs.sqlite "
                             "(default: the cluster config's).")


def _jobs_root(ctx: typer.Context, root: Optional[Path]) -> Optional[Path]:
    """`jobs --root DIR list` as `jobs list --root DIR`: the group's --root counts unless the
    subcommand was given its own on the command line."""
    given = ctx.parent.params.get("root") if ctx.parent is not None else None
    source = ctx.get_parameter_source("root")
    if given is not None and (root is None or getattr(source, "name", "") != "COMMANDLINE"):
        return given
    return root


@contextlib.contextmanager
def _history_errors():
    """A locked, damaged or uncreatable job history ends the command with one line."""
    try:
        yield
    except JobsDBError as err:
        fail(str(err))


def _open_db(root: Optional[Path]):
    where = _root(root, _load_cluster())
    if not (where / DB_FILE).exists():
        if where.exists() and not where.is_dir():
            fail(f"--root {where} is a file; pass the experiments root directory")
        return None, where
    with _history_errors():
        return JobsDB(where), where


def _elapsed(seconds) -> str:
    if seconds is None:
        return ""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _results_word(job: dict) -> str:
    if not job.get("results_json"):
        return ""
    try:
        results = json.loads(job["results_json"])
    except ValueError:
        return "?"
    if not isinstance(results, dict):
        return "parsed"
    word = str(results.get("status") or "parsed")
    step = results.get("step_time_mean_s")
    return f"{word}, {step:.3g} s/step" if isinstance(step, (int, float)) else word


JOBS_WIDE_COLUMNS = 120
"""Below this terminal width the jobs table keeps its key columns only."""


def _jobs_table(jobs: list[dict], root: Path, width: int):
    wide = width >= JOBS_WIDE_COLUMNS
    table = Table(title=f"jobs in {root}", caption=None if wide else
                  "a narrow terminal: `trainbench jobs show ID` has every field")
    # The directory's last part only (its timestamp tells repeats apart); the full path
    # is in `trainbench jobs show ID`. The keys a user (or a script) reads a row by never
    # wrap; on a terminal narrower than the whole row the table keeps those and the name.
    whole = {"id", "job id", "state", "exit"}
    columns = (("id", "executor", "job id", "name", "state", "exit", "elapsed", "submitted",
                "results", "directory") if wide
               else ("id", "executor", "job id", "name", "state", "exit", "elapsed"))
    for col in columns:
        table.add_column(col, overflow="fold", no_wrap=col in whole)
    for job in jobs:
        cells = {"id": str(job["id"]), "executor": job["executor"],
                 "job id": job["job_id"] or "", "name": job["name"], "state": job["state"],
                 "exit": "" if job["exit_code"] is None else str(job["exit_code"]),
                 "elapsed": _elapsed(job["elapsed_s"]),
                 "submitted": time.strftime("%Y-%m-%d %H:%M",
                                            time.localtime(job["submitted"])),
                 "results": _results_word(job), "directory": Path(job["exp_dir"]).name}
        table.add_row(*(cells[col] for col in columns))
    return table


def _list_jobs(root: Optional[Path]) -> None:
    db, where = _open_db(root)
    if db is None:
        typer.echo(f"no jobs recorded under {where} yet")
        return
    with _history_errors():
        settle_local_jobs(db)
        jobs = db.list()
    out = console()
    out.print(_jobs_table(jobs, where, out.width))


def jobs_default(ctx: typer.Context, root: Optional[Path] = ROOT_OPT):
    """Job history: every run, its state, exit code and results (default: list)."""
    if ctx.invoked_subcommand is None:
        _list_jobs(root)


def jobs_list(ctx: typer.Context, root: Optional[Path] = ROOT_OPT):
    """Every recorded job, oldest first."""
    _list_jobs(_jobs_root(ctx, root))


def jobs_show(ctx: typer.Context,
              job: int = typer.Argument(..., help="The job's id in `trainbench jobs`."),
              root: Optional[Path] = ROOT_OPT):
    """One job in full: state, plan, files, results; the log's tail if it failed."""
    db, where = _open_db(_jobs_root(ctx, root))
    row = None
    if db is not None:
        with _history_errors():
            settle_local_jobs(db)
            row = db.get(job)
    if row is None:
        fail(f"no job {job} under {where}; `trainbench jobs list` shows the ids")
    for key in ("id", "executor", "job_id", "name", "state", "slurm_state", "state_source",
                "exit_code"):
        typer.echo(f"{key:>12}: {'' if row[key] is None else row[key]}")
    typer.echo(f"{'elapsed':>12}: {_elapsed(row['elapsed_s'])}")
    for key in ("submitted", "updated"):
        typer.echo(f"{key:>12}: {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(row[key]))}")
    if row["note"]:
        typer.echo(f"{'note':>12}: {row['note']}")
    try:
        plan = json.loads(row["plan_json"])
        lay = plan["layout"]
        typer.echo(f"{'plan':>12}: {plan['workload']} {plan['size']} {plan['dtype']} on "
                   f"{plan['gpus']} {plan['gpu_type']} rank(s), TP{lay['tp']} PP{lay['pp']} "
                   f"CP{lay['cp']} DP{lay['dp']}, MBS {plan['mbs']} GBS {plan['gbs']}, "
                   f"{plan['steps']} steps")
    except (ValueError, KeyError, TypeError):
        typer.echo(f"{'plan':>12}: (unreadable)")
    exp = Path(row["exp_dir"])
    typer.echo(f"{'directory':>12}: {exp}")
    log = exp / log_file_name(row["name"])
    files = [log, exp / EXIT_FILE]
    if row["executor"] == "slurm":
        files += [exp / script_name(row["name"]), exp / sbatch_output_name(row["name"])]
    for f in files:
        typer.echo(f"{'':>12}  {f.name}{'' if f.exists() else ' (missing)'}")
    if row["results_json"]:
        typer.echo("results:")
        typer.echo(json.dumps(json.loads(row["results_json"]), indent=2, sort_keys=True))
    if row["state"] in ("FAILED", "CANCELLED", "TIMEOUT"):
        for f in (log, exp / sbatch_output_name(row["name"])):
            if f.exists():
                try:  # a regular file's last bytes only: a FIFO or a huge log never hangs
                    tail = tail_lines(f, 10)
                except OSError as err:
                    typer.echo(f"{f.name}: {describe_read_error(err)}")
                    continue
                typer.echo(f"last lines of {f.name}:")
                for line in tail:
                    typer.echo(f"  {line[:2000]}")


def jobs_refresh(ctx: typer.Context,
                 ids: List[int] = typer.Argument(None, help="Only these jobs (default: all)."),
                 root: Optional[Path] = ROOT_OPT):
    """Update states from Slurm (squeue, sacct, jobcomp or exit.json); parse results."""
    db, where = _open_db(_jobs_root(ctx, root))
    if db is None:
        typer.echo(f"no jobs recorded under {where} yet")
        return
    with _history_errors():
        # The refreshed rows as refresh saw them: on a full disk they may not be saved.
        fresh = {j["id"]: j for j in refresh(db, ids or None)}
        jobs = [fresh.get(j["id"], j) for j in db.list() if not ids or j["id"] in ids]
    out = console()
    out.print(_jobs_table(jobs, where, out.width))


def register(app: typer.Typer) -> None:
    """Add init, bulk and jobs to the trainbench app."""
    app.command("init")(init_command)
    app.command("bulk", help=BULK_HELP)(bulk_command)

    jobs_app = typer.Typer(help="Job history: every run, its state, exit code and results.",
                           invoke_without_command=True)
    app.add_typer(jobs_app, name="jobs")

    jobs_app.callback()(jobs_default)
    jobs_app.command("list")(jobs_list)
    jobs_app.command("show")(jobs_show)
    jobs_app.command("refresh")(jobs_refresh)
