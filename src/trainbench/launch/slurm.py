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
import shlex
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from ..plan import PlanError
from .experiment import EXIT_FILE, PLAN_FILE

SBATCH_TIMEOUT_S = 60


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

# Environment names that hold credentials. Matched on whole underscore-separated words
# so NCCL_IB_HCA or MONKEY are not caught but HF_TOKEN and WANDB_API_KEY are.
_SECRET_KEY = re.compile(
    r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|PASS|KEY|APIKEY|CREDENTIAL|CREDENTIALS)(_|$)",
    re.IGNORECASE)
_SECRET_VALUE = re.compile(r"hf_[A-Za-z0-9]{30,}")  # a Hugging Face access token
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


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


def check_path(label: str, path: str) -> None:
    """Paths are quoted in the script; only control characters (newlines) are refused."""
    if _CONTROL.search(path):
        raise SlurmError([f"{label} {path!r} contains a newline or control character; "
                          "choose a directory without one"])


# --- rendering ------------------------------------------------------------------------------

def ranks_per_node(plan) -> int:
    return min(plan.gpus, plan.gpus_per_node)


def script_name(name: str) -> str:
    return f"sbatch_{name}.sh"


def sbatch_output_name(name: str) -> str:
    return f"sbatch_{name}.out"


def job_environment(plan, cluster: dict) -> list[tuple[str, str]]:
    """What the script exports, in order: cluster env, then the plan's (which wins)."""
    env = dict(cluster_env(cluster))
    if plan.features.nccl_trace:
        # The seeds' ENABLE_NCCLTRACE: NCCL's own per-collective log lines.
        env.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "COLL,P2P,NET"})
    env.update(dict(plan.env))
    env["PYTHONUNBUFFERED"] = "1"  # rank output reaches the .out files as it happens
    return list(env.items())


def render_sbatch(plan, exp_dir: Path, opts: SlurmOptions, cluster: dict) -> str:
    """The job script for `plan` in `exp_dir`; SlurmError when any input is invalid."""
    opts = check_options(plan, opts, cluster)
    exp = os.path.abspath(str(exp_dir))
    check_path("experiment directory", exp)
    python = sys.executable
    check_path("Python interpreter", python)
    job_name = opts.job_name if opts.job_name is not None else plan.name
    q = shlex.quote

    directives = [
        f"--job-name={job_name}",
        f"--nodes={plan.num_nodes}",
        "--ntasks-per-node=1",
        f"--time={opts.time_limit}",
        # Relative to the working directory, which is the experiment directory: an
        # #SBATCH line cannot quote a path, so no path goes into one.
        f"--output={sbatch_output_name(plan.name)}",
    ]
    if opts.account:
        directives.append(f"--account={opts.account}")
    if opts.partition:
        directives.append(f"--partition={opts.partition}")
    if opts.gres:
        directives.append(f"--gres={opts.gres}")
    if opts.exclusive:
        directives.append("--exclusive")
    if opts.nodelist:
        directives.append(f"--nodelist={opts.nodelist}")
    if opts.exclude:
        directives.append(f"--exclude={opts.exclude}")
    if opts.reservation:
        directives.append(f"--reservation={opts.reservation}")
    directives += list(opts.extra_args)

    lines = [
        "#!/bin/bash",
        f"# trainbench job: {plan.name}, {plan.gpus} ranks on {plan.num_nodes} node(s), "
        f"{ranks_per_node(plan)} per node.",
        "# Rendered by `trainbench run --executor slurm`; to resubmit, run `sbatch "
        f"{script_name(plan.name)}` from this directory.",
        *(f"#SBATCH {d}" for d in directives),
        "",
        "# No `set -e`: the exit record at the end must be written whatever happens.",
        "set -uo pipefail",
        f"EXP_DIR={q(exp)}",
        f"PYTHON={q(python)}",
        f"NPROC_PER_NODE={ranks_per_node(plan)}",
        'cd -- "$EXP_DIR" || exit 1',
        "START_TIME=$(date +%s)",
        "",
        "# Job environment from --env and the cluster config. Secrets are not written",
        "# here: they come from the submitting shell (sbatch --export=ALL, the default).",
    ]
    lines += [f"export {key}={q(value)}" for key, value in job_environment(plan, cluster)]
    lines += [
        "",
        "# The rendezvous runs on the first node of the allocation; a port derived from",
        "# the job id keeps jobs that share a node apart.",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
        "",
        "# One torchrun agent per node (one Slurm task per node), one rank per GPU.",
        'srun --kill-on-bad-exit=1 "$PYTHON" -m torch.distributed.run \\',
        '    --nnodes="$SLURM_JOB_NUM_NODES" --nproc-per-node="$NPROC_PER_NODE" \\',
        '    --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" '
        '--rdzv-id="$SLURM_JOB_ID" \\',
        '    --max-restarts=0 \\',
        f'    -m trainbench.engine "$EXP_DIR/{PLAN_FILE}"',
        "EXIT_CODE=$?",
        "",
        "# The job's own exit record: its state is known even where Slurm keeps no",
        "# accounting. Written to a temporary name first so a reader never sees half.",
        "END_TIME=$(date +%s)",
        'if [ "$EXIT_CODE" -eq 0 ]; then REASON=completed; '
        'else REASON="exit code $EXIT_CODE"; fi',
        "printf '{\"executor\": \"slurm\", \"job_id\": \"%s\", \"exit_code\": %d, "
        "\"reason\": \"%s\", \"elapsed_s\": %d, \"ended\": %d}\\n' \\",
        '    "$SLURM_JOB_ID" "$EXIT_CODE" "$REASON" "$((END_TIME - START_TIME))" "$END_TIME" \\',
        f'    > "$EXP_DIR/{EXIT_FILE}.part" && mv -f "$EXP_DIR/{EXIT_FILE}.part" '
        f'"$EXP_DIR/{EXIT_FILE}"',
        'exit "$EXIT_CODE"',
        "",
    ]
    return "\n".join(lines)


# --- submission -------------------------------------------------------------------------------

def submit(script_path: Path) -> str:
    """`sbatch --parsable SCRIPT` from the script's directory; the job id."""
    try:
        proc = subprocess.run(["sbatch", "--parsable", script_path.name], cwd=script_path.parent,
                              capture_output=True, text=True, timeout=SBATCH_TIMEOUT_S)
    except FileNotFoundError:
        raise SubmitError("sbatch not found: run on a Slurm login node, or use "
                          "--executor local") from None
    except subprocess.TimeoutExpired:
        raise SubmitError(f"sbatch did not answer in {SBATCH_TIMEOUT_S} s; is slurmctld up?") \
            from None
    if proc.returncode != 0:
        message = " ".join(proc.stderr.split()) or f"exit code {proc.returncode}"
        raise SubmitError(f"sbatch refused the job: {message}")
    # --parsable prints "jobid" or "jobid;cluster".
    job_id = proc.stdout.strip().split(";")[0]
    if not re.fullmatch(r"\d+", job_id):
        raise SubmitError(f"sbatch printed {proc.stdout.strip()!r}, not a job id")
    return job_id


def launch_on_slurm(plan, exp_dir: Path, opts: SlurmOptions, cluster: dict,
                    dry_run: bool) -> str | None:
    """Render, write and submit the job; record it in the jobs database.

    dry_run prints the script and touches nothing. Otherwise the script goes to
    exp_dir/sbatch_<name>.sh, is submitted with `sbatch --parsable`, and the job id is
    returned. SlurmError for invalid input (nothing written), SubmitError when sbatch fails
    (the script stays in exp_dir; no job is recorded).
    """
    from .jobs import JobsDB, root_of_experiment

    exp_dir = Path(exp_dir)
    script = render_sbatch(plan, exp_dir, opts, cluster)
    if dry_run:
        print(script, end="")
        return None
    script_path = exp_dir / script_name(plan.name)
    with open(script_path, "x") as fh:  # a fresh directory: never overwrite
        fh.write(script)
    job_id = submit(script_path)
    db = JobsDB(root_of_experiment(exp_dir, cluster))
    db.add("slurm", job_id, plan.name, str(exp_dir), plan.to_json(), "PENDING")
    return job_id


def submit_plan(plan, root: Path, opts: SlurmOptions, cluster: dict) -> tuple[Path, str]:
    """Validate, create a fresh experiment directory, write plan.json, submit.

    Bad input raises SlurmError before anything is created; when sbatch refuses the job
    the directory made for it is removed again, so a failure leaves nothing behind.
    Returns (experiment directory, Slurm job id).
    """
    import shutil
    from dataclasses import replace as with_fields

    from .experiment import new_experiment_dir

    check_options(plan, opts, cluster)
    exp_dir = new_experiment_dir(root, plan.name)
    try:
        check_path("experiment directory", str(exp_dir))
        plan = with_fields(plan, out_dir=str(exp_dir))
        (exp_dir / PLAN_FILE).write_text(plan.to_json())
        job_id = launch_on_slurm(plan, exp_dir, opts, cluster, dry_run=False)
    except (SlurmError, SubmitError):
        # Nothing was submitted: the directory holds no job. (A failure after sbatch
        # accepted the job keeps it: the job will write there.)
        shutil.rmtree(exp_dir, ignore_errors=True)
        raise
    return exp_dir, job_id
