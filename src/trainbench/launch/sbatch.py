"""A plan as an sbatch script, and its submission: the script is written into the
experiment directory and submitted from there (see launch/slurm.py for how every value a
user can type is validated or quoted before it reaches the script)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace as with_fields
from pathlib import Path

from ..rundir import EXIT_FILE, PLAN_FILE, new_experiment_dir, root_of_experiment
from .jobs import JobsDB
from .local import nsys_prefix
from .rank_env import NCCL_TRACE, rank_additions
from .slurm import (SlurmError, SlurmOptions, SubmitError, check_options, check_path, cluster_env,
                    ranks_per_node, warn_missing_settings)

SBATCH_TIMEOUT_S = 60


# --- rendering ------------------------------------------------------------------------------
def script_name(name: str) -> str:
    return f"sbatch_{name}.sh"


def sbatch_output_name(name: str) -> str:
    return f"sbatch_{name}.out"


def job_environment(plan, cluster: dict) -> list[tuple[str, str]]:
    """What the script exports, in order: cluster env, then the plan's (which wins)."""
    env = dict(cluster_env(cluster))
    if plan.features.nccl_trace:
        # The seeds' ENABLE_NCCLTRACE: NCCL's own per-collective log lines.
        env.update(NCCL_TRACE)
    env.update(dict(plan.env))
    # The job inherits this shell's environment (sbatch --export=ALL, the default).
    env.update(rank_additions(plan, {**os.environ, **env}))
    return list(env.items())


def _engine_lines(plan, exp: str) -> list[str]:
    """What torchrun starts per rank: the engine, under Nsight Systems when profiling with
    nsys (the same flags as the local executor; one report per rank in profile/)."""
    # Another rank program (the probe's worker) names its module and the file it reads.
    module, plan_file = getattr(plan, "rank_program", ("trainbench.engine", PLAN_FILE))
    if plan.features.profile != "nsys":
        return [f'    -m {module} "$TB_EXP_DIR/{plan_file}"']
    nsys = shlex.join(nsys_prefix(Path(exp)))
    return ["    --no-python \\",
            f"    {nsys} \\",
            f'    "$TB_PYTHON" -m trainbench.engine "$TB_EXP_DIR/{PLAN_FILE}"']


def _directives(plan, opts: SlurmOptions) -> list[str]:
    """The job's #SBATCH options, from the plan and the checked Slurm options."""
    job_name = opts.job_name if opts.job_name is not None else plan.name
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
    return directives


def render_sbatch(plan, exp_dir: Path, opts: SlurmOptions, cluster: dict) -> str:
    """The job script for `plan` in `exp_dir`; SlurmError when any input is invalid."""
    opts = check_options(plan, opts, cluster)
    exp = os.path.abspath(str(exp_dir))
    check_path("experiment directory", exp)
    python = sys.executable
    check_path("Python interpreter", python)
    q = shlex.quote
    directives = _directives(plan, opts)

    lines = [
        "#!/bin/bash",
        f"# trainbench job: {plan.name}, {plan.gpus} ranks on {plan.num_nodes} node(s), "
        f"{ranks_per_node(plan)} per node.",
        "# Rendered by trainbench. To resubmit, from this directory:",
        f"#   sbatch {script_name(plan.name)}",
        *(f"#SBATCH {d}" for d in directives),
        "",
        "# No `set -e`: the exit record at the end must be written whatever happens.",
        "set -uo pipefail",
        f"TB_EXP_DIR={q(exp)}",
        f"TB_PYTHON={q(python)}",
        f"TB_NPROC_PER_NODE={ranks_per_node(plan)}",
        'cd -- "$TB_EXP_DIR" || exit 1',
        *(['mkdir -p -- "$TB_EXP_DIR/profile"'] if plan.features.profile == "nsys" else []),
        "TB_START=$(date +%s)",
        "",
        "# Job environment from --env and the cluster config. Secrets are not written",
        "# here: they come from the submitting shell (sbatch --export=ALL, the default).",
    ]
    lines += [f"export {key}={q(value)}" for key, value in job_environment(plan, cluster)]
    lines += [
        "",
        "# The rendezvous runs on the first node of the allocation; a port derived from",
        "# the job id keeps jobs that share a node apart.",
        'TB_RDZV_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "TB_RDZV_PORT=$((20000 + SLURM_JOB_ID % 20000))",
        "",
        "# One torchrun agent per node (one Slurm task per node), one rank per GPU.",
        'srun --kill-on-bad-exit=1 "$TB_PYTHON" -m torch.distributed.run \\',
        '    --nnodes="$SLURM_JOB_NUM_NODES" --nproc-per-node="$TB_NPROC_PER_NODE" \\',
        '    --rdzv-backend=c10d --rdzv-endpoint="$TB_RDZV_HOST:$TB_RDZV_PORT" '
        '--rdzv-id="$SLURM_JOB_ID" \\',
        '    --max-restarts=0 \\',
        *_engine_lines(plan, exp),
        "TB_EXIT_CODE=$?",
        "",
        "# The job's own exit record: its state is known even where Slurm keeps no",
        "# accounting. Written to a temporary name first so a reader never sees half.",
        "TB_END=$(date +%s)",
        'if [ "$TB_EXIT_CODE" -eq 0 ]; then TB_REASON=completed; '
        'else TB_REASON="exit code $TB_EXIT_CODE"; fi',
        "printf '{\"executor\": \"slurm\", \"job_id\": \"%s\", \"exit_code\": %d, "
        "\"reason\": \"%s\", \"elapsed_s\": %d, \"ended\": %d}\\n' \\",
        '    "$SLURM_JOB_ID" "$TB_EXIT_CODE" "$TB_REASON" "$((TB_END - TB_START))" "$TB_END" \\',
        f'    > "$TB_EXP_DIR/{EXIT_FILE}.part" && mv -f "$TB_EXP_DIR/{EXIT_FILE}.part" '
        f'"$TB_EXP_DIR/{EXIT_FILE}"',
        'exit "$TB_EXIT_CODE"',
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
        lines = [re.sub(r"^sbatch:\s*(error:\s*)?", "", ln.strip())
                 for ln in proc.stderr.splitlines()]
        message = "; ".join(ln for ln in lines if ln) or f"exit code {proc.returncode}"
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
    exp_dir = Path(exp_dir)
    script = render_sbatch(plan, exp_dir, opts, cluster)
    if dry_run:
        warn_missing_settings(plan, opts, cluster)
        print(script, end="")
        return None
    script_path = exp_dir / script_name(plan.name)
    with open(script_path, "x") as fh:  # a fresh directory: never overwrite
        fh.write(script)
    job_id = submit(script_path)
    db = JobsDB(root_of_experiment(exp_dir, cluster))
    db.add("slurm", job_id, plan.name, str(exp_dir), plan.to_json(), "PENDING")
    return job_id


def submit_plan(plan, root: Path, opts: SlurmOptions, cluster: dict,
                warn: bool = True) -> tuple[Path, str]:
    """Validate, create a fresh experiment directory, write plan.json, submit.

    Bad input raises SlurmError before anything is created; when sbatch refuses the job
    the directory made for it is removed again, so a failure leaves nothing behind.
    Returns (experiment directory, Slurm job id). `warn`: say on stderr which cluster
    settings the script lacks (bulk says it once for the sweep instead).
    """
    check_options(plan, opts, cluster)
    if warn:
        warn_missing_settings(plan, opts, cluster)
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
