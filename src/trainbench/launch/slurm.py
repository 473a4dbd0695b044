"""The Slurm executor: a plan becomes an sbatch script (srun + torchrun with a c10d
rendezvous on the first node), written into the experiment directory and submitted.

One torchrun agent per node (`--ntasks-per-node=1`), each starting one rank per GPU;
the rendezvous id is the Slurm job id, so two jobs never join each other.

Everything a user can type reaches the script only after validation or quoting:
- `#SBATCH` lines are read by sbatch, not bash, and sbatch has no quoting a path could
  rely on, so they carry only values matched against a strict character set (names,
  hostlists, times) and no path at all: the output file is relative to the experiment
  directory, which is where the script is submitted from.
- The body is bash: the experiment directory, the Python path and every environment
  value are single-quoted with shlex.quote; environment keys must be identifiers;
  newlines and control characters are refused outright.
- Secrets (HF_TOKEN, *_TOKEN, *_KEY, ...) are refused in plan and config env: they reach
  the job from the submitting shell through sbatch's default `--export=ALL`, and so are
  never written to disk.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, replace

from ..catalog import hardware
from ..config import config_path
from ..files import brief
from ..plan import PlanError


class SlurmError(PlanError):
    """Invalid Slurm input (options, environment, paths); one line per problem.

    A PlanError, so a command that reports plan problems reports these the same way."""


class SubmitError(ValueError):
    """sbatch is missing or refused the job (most often an account or partition it does
    not know); the message is one line."""


@dataclass(frozen=True)
class SlurmOptions:
    account: str | None = None
    """Slurm account (-A); None = the cluster config's, else Slurm's default."""
    partition: str | None = None
    """Partition (-p); None = the cluster config's, else Slurm's default."""
    time_limit: str = "00:30:00"
    nodelist: str | None = None
    exclude: str | None = None
    reservation: str | None = None
    exclusive: bool = True
    gres: str | None = None
    """e.g. 'gpu:8'; None = the cluster config's, else no --gres line."""
    extra_args: tuple[str, ...] = ()
    """`--slurm-arg` passthrough, each `--option` or `--option=value`."""
    job_name: str | None = None
    """None = the plan's name."""


# --- validation ---------------------------------------------------------------------------

_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")
_WORD_LIST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*(,[A-Za-z0-9_][A-Za-z0-9_.+-]*)*")
_HOSTLIST = re.compile(r"[A-Za-z0-9_.\[\],-]+")
_GRES = re.compile(r"[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+){0,2}(,[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+){0,2})*")
# minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (sbatch --time)
_TIME = re.compile(r"\d{1,6}(-\d{1,2})?(:\d{1,2}){0,2}|UNLIMITED|INFINITE")
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# No whitespace, quotes, $, backtick, backslash, ;, <, >, # or control characters:
# nothing that could end the #SBATCH line or mean something to a shell.
_EXTRA_ARG = re.compile(r"(--[A-Za-z][A-Za-z0-9-]*)(=[A-Za-z0-9_.,:@/%+=\[\]&|*!^-]+)?")

# Options trainbench writes itself, with the command-line option that sets each.
# sbatch accepts any unambiguous prefix of a long option, so prefixes are refused too.
_OWN_OPTIONS = {
    "--job-name": "the plan's name", "--nodes": "--scale and gpus_per_node",
    "--ntasks": "the plan (one task per node)", "--ntasks-per-node": "the plan",
    "--output": "the experiment directory", "--error": "the experiment directory",
    "--chdir": "the experiment directory", "--export": "--env (secrets pass from your shell)",
    "--wrap": "the plan", "--parsable": "trainbench", "--time": "--time-limit",
    "--account": "--account", "--partition": "--partition", "--gres": "--gres",
    "--exclusive": "--exclusive/--no-exclusive", "--nodelist": "--nodelist",
    "--exclude": "--exclude", "--reservation": "--reservation",
}

# Environment names that hold credentials, matched on whole underscore-separated words:
# HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY and DB_PASSWORD are caught; MONKEY,
# TOKENIZERS_PARALLELISM and HF_TOKEN_PATH (a path, not the token) are not.
_SECRET_KEY = re.compile(
    r"(^|_)(TOKEN|KEY|APIKEY|PASS|PASSWD|PASSWORD|SECRET|CREDENTIALS?)$"
    r"|(^|_)(SECRET|PASSWORD|PASSWD|CREDENTIALS?)(_|$)",
    re.IGNORECASE)
_SECRET_VALUE = re.compile(r"hf_[A-Za-z0-9]{30,}")  # a Hugging Face access token
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Names that would change how the job script itself runs: its own variables (TB_*),
# Slurm's, and the shell's. Values are literal, so PATH='/x:$PATH' could only break it.
_RESERVED_KEY = re.compile(r"TB_.*|SLURM_.*|SRUN_.*|SBATCH_.*|BASH_.*|PATH|IFS|ENV|CDPATH|"
                           r"SHELLOPTS|BASHOPTS|PS4")
# Names that make every process of the job load or run code it did not ask for: the
# dynamic loader's (LD_PRELOAD, LD_LIBRARY_PATH, DYLD_*) and the shell's start-up hooks.
# A config file or a sweep must not be able to do that silently; whoever means it exports
# it in their own shell, which the job inherits.
_CODE_LOADING_KEY = re.compile(r"LD_.*|DYLD_.*|PROMPT_COMMAND|BASH_ENV|ENV")


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key))


def check_env(pairs, source: str) -> list[str]:
    """Problems with environment pairs headed for a job script (empty when all fine)."""
    problems = []
    for key, value in pairs:
        if not isinstance(key, str) or not ENV_KEY.fullmatch(key):
            problems.append(f"{source}: {key!r} is not a valid variable name "
                            "(letters, digits and _, not starting with a digit)")
            continue
        if _CODE_LOADING_KEY.fullmatch(key):
            problems.append(f"{source}: {key} decides which code every process of the job "
                            f"loads and cannot be set here; export {key} in the shell you "
                            "launch from if you mean it (the job inherits it)")
            continue
        if _RESERVED_KEY.fullmatch(key):
            problems.append(f"{source}: {key} is used by the job script or Slurm itself "
                            "and cannot be set for the job")
            continue
        if is_secret_key(key):
            problems.append(
                f"{source}: {key} looks like a secret and is never written into a job script; "
                f"export {key} in the shell you submit from instead (sbatch passes it to the job)")
            continue
        if not isinstance(value, str):
            problems.append(f"{source}: {key} must be a string, not {type(value).__name__}")
        elif "\n" in value or "\r" in value or "\x00" in value:
            problems.append(f"{source}: the value of {key} contains a newline; "
                            "job environment values must be one line")
        elif _SECRET_VALUE.search(value):
            problems.append(f"{source}: the value of {key} looks like a Hugging Face token; "
                            "export it as HF_TOKEN in your shell instead")
    return problems


def check_extra_arg(arg: str) -> str | None:
    """The problem with one `--slurm-arg`, or None."""
    match = _EXTRA_ARG.fullmatch(arg) if isinstance(arg, str) else None
    if not match:
        return (f"--slurm-arg {arg!r}: use the long form --option or --option=value, "
                "without spaces, quotes or shell characters ($ ` ; < > \\ #)")
    name = match.group(1)
    for own, use in _OWN_OPTIONS.items():
        if own.startswith(name):
            return f"--slurm-arg {arg}: trainbench sets {own} itself; use {use}"
    return None


def _check_value(problems: list[str], label: str, value: str | None, pattern: re.Pattern,
                 example: str) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not pattern.fullmatch(value):
        problems.append(f"{label} {value!r} is not valid (e.g. {example}; letters, digits "
                        "and . _ - only, no spaces or shell characters)")


def cluster_slurm(cluster: dict) -> dict:
    section = cluster.get("slurm") or {}
    if not isinstance(section, dict):
        raise SlurmError(["cluster config: 'slurm' must be a mapping; rerun `trainbench init`"])
    return section


def cluster_env(cluster: dict) -> list[tuple[str, str]]:
    """The cluster config's `env` mapping as pairs; numbers and booleans become strings."""
    env = cluster.get("env") or {}
    if not isinstance(env, dict):
        raise SlurmError(["cluster config: 'env' must be a mapping of NAME: value"])
    pairs = []
    for key, value in env.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (int, float)):
            value = str(value)
        pairs.append((key, value))
    return pairs


def effective_options(opts: SlurmOptions, cluster: dict) -> SlurmOptions:
    """Fill what the command line left open from the cluster config's slurm section."""
    section = cluster_slurm(cluster)
    extra = section.get("extra_args") or []
    if isinstance(extra, str):
        extra = [extra]
    return replace(
        opts,
        account=opts.account if opts.account is not None else section.get("account"),
        partition=opts.partition if opts.partition is not None else section.get("partition"),
        gres=opts.gres if opts.gres is not None else section.get("gres"),
        extra_args=tuple(extra) + tuple(opts.extra_args),
    )


def check_options(plan, opts: SlurmOptions, cluster: dict) -> SlurmOptions:
    """Validate everything that will enter the script except the experiment path.

    Returns the effective options (cluster defaults filled in); raises SlurmError with
    one line per problem. Call it before creating an experiment directory so that bad
    input leaves nothing behind.
    """
    opts = effective_options(opts, cluster)
    problems: list[str] = []
    # The plan's name also names the script and output files, so it is checked even when
    # --job-name replaces it as the Slurm job name.
    for label, name in (("experiment name", plan.name), ("job name", opts.job_name)):
        if name is not None and (not isinstance(name, str) or not _JOB_NAME.fullmatch(name)):
            problems.append(f"{label} {name!r} is not valid: use letters, digits and . _ + - "
                            "(at most 128 characters)")
    _check_value(problems, "--account", opts.account, _WORD, "--account=myproj")
    _check_value(problems, "--partition", opts.partition, _WORD_LIST, "--partition=batch")
    _check_value(problems, "--reservation", opts.reservation, _WORD, "--reservation=bench")
    _check_value(problems, "--nodelist", opts.nodelist, _HOSTLIST, "--nodelist=node[01-04]")
    _check_value(problems, "--exclude", opts.exclude, _HOSTLIST, "--exclude=node07")
    _check_value(problems, "--gres", opts.gres, _GRES, "--gres=gpu:8")
    if not isinstance(opts.time_limit, str) or not _TIME.fullmatch(opts.time_limit):
        problems.append(f"--time-limit {opts.time_limit!r} is not a Slurm time "
                        "(MM, HH:MM:SS or D-HH:MM:SS, e.g. 00:30:00)")
    for arg in opts.extra_args:
        if (problem := check_extra_arg(arg)) is not None:
            problems.append(problem)
    problems += check_env(cluster_env(cluster), "cluster config env")
    problems += check_env(plan.env, "--env")
    if problems:
        raise SlurmError(problems)
    return opts


def missing_settings(plan, opts: SlurmOptions, cluster: dict) -> str | None:
    """One warning line naming the cluster settings the job script will lack, and the
    `trainbench init` command that sets them; None when nothing is missing.
    Options given on the command line count as set.

    None of them makes sbatch fail for certain (a user's default account and the
    cluster's default partition often exist, and a cluster may not schedule GPUs as
    GRES), so this warns and never refuses. A GPU plan without GRES is the likely
    failure: on a GRES cluster its ranks see no GPU."""
    configured = bool(cluster_slurm(cluster))
    opts = effective_options(opts, cluster)
    # Once `trainbench init` has written the config, an empty account or partition is the
    # user's choice (clusters without accounts, a default partition); GRES stays needed.
    missing = [(name, option, example) for name, option, example, value, needed in (
        ("account", "--account", "ACCOUNT", opts.account, not configured),
        ("partition", "--partition", "PARTITION", opts.partition, not configured),
        ("GRES", "--gres", f"gpu:{ranks_per_node(plan)}", opts.gres, plan.device != "cpu"),
    ) if needed and not value]
    if not missing:
        return None
    names = [m[0] for m in missing]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    where = ("in the cluster config" if configured
             else f"(no cluster config at {config_path()})")
    defaults = [d for name, d in (("account", "your default account"),
                                  ("partition", "the cluster's default partition"))
                if name in names]
    effects = []
    if defaults:
        effects.append("sbatch uses " + " and ".join(defaults))
    if "GRES" in names:
        effects.append("the job asks Slurm for no GPUs, so on a GRES cluster its ranks see none")
    init = " ".join(f"{option} {example}" for _, option, example in missing)
    return (f"trainbench: warning: no {listed} set {where}: {'; '.join(effects)}; set "
            f"{'it' if len(missing) == 1 else 'them'} with `trainbench init {init}` "
            f"(or pass {', '.join(m[1] for m in missing)})")


def warn_missing_settings(plan, opts: SlurmOptions, cluster: dict) -> None:
    line = missing_settings(plan, opts, cluster)
    if line:
        print(line, file=sys.stderr)


def check_path(label: str, path: str) -> None:
    """Paths are quoted in the script; only control characters (newlines) are refused."""
    if _CONTROL.search(path):
        raise SlurmError([f"{label} {path!r} contains a newline or control character; "
                          "choose a directory without one"])


def ranks_per_node(plan) -> int:
    return min(plan.gpus, plan.gpus_per_node)


# --- the cluster config's launcher keys -----------------------------------------------------

CONFIG_KEYS = ("slurm", "experiments_root", "env", "gpu_type", "gpus_per_node")


def parse_env_items(items: list[str], source: str = "--env") -> dict[str, str]:
    """['K=V', ...] -> {K: V}; SlurmError listing malformed items, bad names and secrets."""
    pairs, problems = [], []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            problems.append(f"{source} {item!r} is not KEY=VALUE")
            continue
        pairs.append((key, value))
    problems += check_env(pairs, source)
    if problems:
        raise SlurmError(problems)
    return dict(pairs)


def check_cluster_config(data: dict) -> list[str]:
    """Problems with the launcher's keys of a cluster config (empty when valid)."""
    problems: list[str] = []
    try:
        section = cluster_slurm(data)
        env = cluster_env(data)
    except SlurmError as err:
        return err.problems
    unknown = set(section) - {"account", "partition", "gres", "extra_args"}
    if unknown:
        problems.append(f"slurm: unknown keys {', '.join(sorted(unknown))}; "
                        "known: account, partition, gres, extra_args")
    _check_value(problems, "account", section.get("account"), _WORD, "myproj")
    _check_value(problems, "partition", section.get("partition"), _WORD_LIST, "batch")
    _check_value(problems, "gres", section.get("gres"), _GRES, "gpu:8")
    extra = section.get("extra_args") or []
    if not isinstance(extra, list):
        problems.append("slurm.extra_args must be a list of --option=value strings")
    else:
        problems += [p for a in extra if (p := check_extra_arg(a)) is not None]
    problems += check_env(env, "env")
    gpu_type = data.get("gpu_type")
    if gpu_type is not None and str(gpu_type).lower() not in (*hardware.GPUS, hardware.CPU):
        problems.append(f"gpu_type {brief(gpu_type)} is unknown; use one of "
                        f"{', '.join(hardware.GPUS)} or cpu")
    per_node = data.get("gpus_per_node")
    if per_node is not None and (not isinstance(per_node, int) or isinstance(per_node, bool)
                                 or per_node < 1):
        problems.append(f"gpus_per_node {brief(per_node)} must be a positive integer")
    root = data.get("experiments_root")
    if root is not None:
        if not isinstance(root, str) or not os.path.isabs(root):
            problems.append(f"experiments_root {brief(root)} must be an absolute path")
        elif _CONTROL.search(root):
            problems.append("experiments_root contains a newline or control character")
    return problems


def _query(cmd: list[str]) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def detect_cluster() -> dict:
    """Defaults for `trainbench init` from sinfo and sacctmgr, where they answer.

    Keys (each only when found): partition (the default one, else the first), partitions,
    gres, gpus_per_node, gpu_type, account, accounts.
    """
    found: dict = {}
    out = _query(["sinfo", "-h", "-o", "%P|%G"])
    if out:
        rows = [line.split("|", 1) for line in out.splitlines() if "|" in line]
        names = [p.rstrip("*") for p, _ in rows]
        if names:
            found["partitions"] = list(dict.fromkeys(names))
            default = next((p.rstrip("*") for p, _ in rows if p.endswith("*")), names[0])
            found["partition"] = default
            gres = next((g for p, g in rows if p.rstrip("*") == default), "")
            m = re.search(r"gpu(?::([A-Za-z0-9_]+))?:(\d+)", gres)
            if m:
                kind, count = m.group(1), int(m.group(2))
                found["gpus_per_node"] = count
                found["gres"] = f"gpu:{count}"
                if kind and kind.lower() in hardware.GPUS:
                    found["gpu_type"] = kind.lower()
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or ""
    if user and _WORD.fullmatch(user):
        out = _query(["sacctmgr", "-n", "-P", "show", "association", f"user={user}",
                      "format=Account"])
        accounts = list(dict.fromkeys(a.strip() for a in (out or "").splitlines() if a.strip()))
        if accounts:
            found["accounts"] = accounts
        out = _query(["sacctmgr", "-n", "-P", "show", "user", user, "format=DefaultAccount"])
        default = (out or "").strip().splitlines()[0].strip() if (out or "").strip() else ""
        if default or accounts:
            found["account"] = default or accounts[0]
    return found
