"""What a user asked `trainbench run` for, turned into a validated plan: no Typer here.

The command maps its options to a `RunRequest`; `plan_run` checks everything a run needs
(options, the seeds' environment variables, the cluster config, a checkpoint to load, the
device, the experiments root and the job history) and returns a `PlannedRun` or raises
`RunRequestError`, having created nothing. `start_local` then creates the experiment and
runs it. The seeds' environment variables (ENABLE_PROFILE, PROFILE_START_STEP,
PROFILE_STOP_STEP) are read from `RunRequest.environ`, so tests pass their own.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from ..catalog import hardware
from ..config import load_config
from ..default_dtype import default_dtype_for
from ..engine.checkpoint_dirs import CheckpointError, check_model, resolve
from ..engine.straggler_text import SLOW_RANK_ENV, parse_slow_rank
from ..files import brief
from ..metrics import parse_window
from ..overrides import parse_overrides
from ..plan import Features, Plan, PlanError
from ..planning import build_plan
from ..predict.memory import tensor_bytes
from ..results import summarize_experiment
from ..rundir import (PLAN_FILE, RootError, checked_root, experiments_root, new_experiment_dir,
                      root_problem)
from .jobs import JobsDB, JobsDBError, exit_record
from .local import Interrupts, disk_space_problem, run_local
from .slurm import SlurmError, SlurmOptions, check_env, cluster_env, parse_env_items


class RunRequestError(Exception):
    """One line per problem, each saying what is wrong and how to fix it."""

    def __init__(self, *problems: str):
        super().__init__(problems[0] if problems else "invalid run request")
        self.problems = list(problems)


@dataclass(frozen=True)
class RunRequest:
    workload: str
    size: str
    scale: int
    dtype: str | None = None
    """None: bf16 on a GPU or a CPU with native bf16, fp32 on other CPUs."""
    gpu: str | None = None
    """None: detected on this machine (or the cluster config's, for Slurm)."""
    gpus_per_node: int | None = None
    steps: int | None = None
    """None: 50; 25 when profiling, 5 with an NCCL trace, 1 after a checkpoint load."""
    settings: tuple[str, ...] = ()
    peak_tflops: float | None = None
    root: Path | None = None
    env: tuple[str, ...] = ()
    dry_run: bool = False
    executor: str = "local"
    profile: str = ""
    profile_steps: str | None = None
    profile_ranks: str = "0"
    nccl_trace: bool = False
    checkpoint: bool = False
    checkpoint_interval: int = 0
    load_checkpoint: str | None = None
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    """sbatch options for --executor slurm."""
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


@dataclass(frozen=True)
class PlannedRun:
    plan: Plan
    root: Path
    cluster: dict
    dtype_reason: str | None = None
    """Why the default dtype was chosen, when the request named none."""
    notes: tuple[str, ...] = ()
    """Things the user should know that do not stop the run."""


def gpu_names() -> list[str]:
    """Names of this machine's visible NVIDIA GPUs, via nvidia-smi (no torch import:
    planning stays fast); [] where there is none."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    names = [n.strip() for n in out.stdout.splitlines() if n.strip()] if out.returncode == 0 else []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        names = names[:len([d for d in visible.split(",") if d.strip()])]
    return names


def detect_gpu_type() -> tuple[str, str]:
    """(catalog key or 'cpu' or '', device name) of this machine's first GPU."""
    names = gpu_names()
    if not names:
        return hardware.CPU, "CPU"
    gpu = hardware.gpu_from_device_name(names[0])
    return (gpu.key if gpu else ""), names[0]


def parse_ranks(text: str, scale: int) -> tuple[int, ...]:
    """'0,1' -> (0, 1); 'all' -> every rank; ValueError with the fix otherwise."""
    if text.strip().lower() == "all":
        return tuple(range(scale))
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not all(re.fullmatch(r"[0-9]{1,18}", part) for part in parts):  # ASCII digits only
        raise ValueError(f"--profile-ranks {brief(text)}: use rank numbers like 0,1 or 'all'")
    ranks = tuple(sorted({int(part) for part in parts}))
    bad = [r for r in ranks if not 0 <= r < scale]
    if not ranks or bad:
        raise ValueError(f"--profile-ranks {brief(text)}: ranks must be in 0-{scale - 1}")
    return ranks


_TRUE = ("1", "true", "t", "yes", "y", "on")
_FALSE = ("", "0", "false", "f", "no", "n", "off")


def env_flag(environ: Mapping[str, str], name: str) -> bool:
    """A boolean environment variable, read as click reads ENABLE_CHECKPOINT; ValueError
    for anything else (ENABLE_PROFILE=maybe is refused, not read as false)."""
    value = environ.get(name, "").strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise ValueError(f"{name}={environ[name]!r} is not a boolean; use true or false")


def env_int(environ: Mapping[str, str], name: str, default: int) -> int:
    """An integer environment variable (PROFILE_START_STEP, ...); ValueError naming it."""
    value = environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={environ[name]!r} is not an integer step number") from None


def _profile_window(req: RunRequest) -> tuple[str, int, int]:
    """(profiler, first step, last step) from the options and the seeds' variables."""
    try:
        profile_env = env_flag(req.environ, "ENABLE_PROFILE")
        env_start = env_int(req.environ, "PROFILE_START_STEP", 20)
        env_stop = env_int(req.environ, "PROFILE_STOP_STEP", 25)
    except ValueError as err:
        raise RunRequestError(str(err)) from None
    profile = req.profile or ("torch" if profile_env else "")
    if profile not in ("", "torch", "nsys"):
        raise RunRequestError(f"unknown profiler {profile!r}; use torch or nsys")
    if not req.profile_steps:
        return profile, env_start, env_stop
    try:
        start, stop = parse_window(req.profile_steps)
    except ValueError as err:
        raise RunRequestError(str(err).replace("window", "--profile-steps")) from None
    return profile, start, stop


def _job_environment(req: RunRequest, cluster: dict) -> dict[str, str]:
    """The ranks' environment: the cluster config's (local runs), then --env."""
    try:
        # Secrets never enter plan.json or a job script, whatever the executor: the
        # ranks inherit them from this shell instead.
        env_vars = parse_env_items(list(req.env), "--env")
    except PlanError as err:
        raise RunRequestError(*err.problems) from None
    except ValueError as err:
        raise RunRequestError(str(err).splitlines()[0]) from None
    if req.executor != "local":
        return env_vars
    # The same rules as for a job script: a config must not make the ranks load code.
    try:
        cluster_pairs = cluster_env(cluster)
    except SlurmError as err:
        raise RunRequestError(err.problems[0]) from None
    bad = check_env(cluster_pairs, "cluster config env")
    if bad:
        raise RunRequestError(bad[0])
    return {**dict(cluster_pairs), **env_vars}


def _gpu_type(req: RunRequest, gpu: str | None) -> str:
    if gpu is not None:
        return gpu
    gpu_type, device_name = detect_gpu_type()
    if not gpu_type and req.peak_tflops is None:
        raise RunRequestError(f"this machine's GPU {device_name!r} is not in the catalog; pass "
                              "--peak-tflops and --gpu NAME")
    return gpu_type or re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")


def plan_run(req: RunRequest) -> PlannedRun:
    """Everything a run needs, checked before anything is created or printed."""
    if req.executor not in ("local", "slurm"):
        raise RunRequestError(f"unknown executor {req.executor!r}; use local or slurm")
    if req.scale < 1:
        raise RunRequestError(f"--scale {req.scale}: the scale is the number of ranks (GPUs, or "
                              "processes on a CPU) and must be at least 1")
    try:  # the straggler test hook: a typo fails here, before any rank starts
        slow = parse_slow_rank(os.environ.get(SLOW_RANK_ENV))
    except ValueError as err:
        raise RunRequestError(str(err)) from None
    if slow is not None and slow[0] >= req.scale:
        raise RunRequestError(f"{SLOW_RANK_ENV}={os.environ[SLOW_RANK_ENV]} names rank "
                              f"{slow[0]} of a {req.scale}-rank run; use a rank below "
                              f"{req.scale} or unset it")
    profile, start, stop = _profile_window(req)
    steps = req.steps
    if steps is None:
        steps = (1 if req.load_checkpoint else 5 if req.nccl_trace
                 else max(25, stop + 1) if profile else 50)
    try:
        overrides = parse_overrides(list(req.settings))
        cluster = load_config()
    except PlanError as err:
        raise RunRequestError(*err.problems) from None
    except ValueError as err:
        raise RunRequestError(str(err).splitlines()[0]) from None
    env_vars = _job_environment(req, cluster)
    gpu, gpus_per_node = req.gpu, req.gpus_per_node
    if req.executor == "slurm":
        gpu = gpu or cluster.get("gpu_type")
        gpus_per_node = gpus_per_node or cluster.get("gpus_per_node")

    found, notes = _checkpoint_to_load(req, profile, start, stop, steps)
    load_checkpoint = str(found.path.resolve()) if found is not None else req.load_checkpoint
    try:
        ranks_to_profile = parse_ranks(req.profile_ranks, req.scale)
    except ValueError as err:
        raise RunRequestError(str(err)) from None
    gpu_type = _gpu_type(req, gpu)
    dtype, dtype_reason = req.dtype, None
    if dtype is None:
        dtype, dtype_reason = default_dtype_for(req.workload, req.size, gpu_type)
    features = Features(profile=profile, profile_start=start, profile_stop=stop,
                        profile_ranks=ranks_to_profile, nccl_trace=req.nccl_trace,
                        checkpoint=req.checkpoint, checkpoint_interval=req.checkpoint_interval,
                        load_checkpoint=load_checkpoint or "")
    try:
        plan = build_plan(req.workload, req.size, dtype, req.scale, gpu_type,
                          overrides=overrides, steps=steps, features=features,
                          peak_tflops=req.peak_tflops, gpus_per_node=gpus_per_node,
                          env=env_vars)
    except PlanError as err:
        raise RunRequestError(*err.problems) from None
    if found is not None:
        # The model this plan builds (overrides included) against the one saved.
        try:
            check_model(found, req.workload, req.size, plan.model, plan.master_weights)
        except CheckpointError as err:
            raise RunRequestError(str(err)) from None
    if profile == "nsys" and req.executor == "local" and not shutil.which("nsys"):
        raise RunRequestError("--profile nsys: nsys (Nsight Systems) is not on PATH; install "
                              "it or use --profile torch")
    root = _experiments_root(req, cluster)
    if not req.dry_run:
        _check_where_the_run_is_recorded(req, root)
    return PlannedRun(plan=plan, root=root, cluster=cluster, dtype_reason=dtype_reason,
                      notes=tuple(notes))


def _checkpoint_to_load(req: RunRequest, profile: str, start: int, stop: int,
                        steps: int) -> tuple[object | None, list[str]]:
    """(the checkpoint --load-checkpoint names, resolved; notes), or (None, []) without
    one. Resolved before anything launches: a folder without a complete checkpoint is an
    error, never a silent fresh start."""
    if not req.load_checkpoint:
        return None, []
    try:
        found, skipped = resolve(req.load_checkpoint)
    except CheckpointError as err:
        raise RunRequestError(str(err)) from None
    loaded_step = found.step
    if profile and not (loaded_step <= start and stop < loaded_step + steps):
        raise RunRequestError(
            f"--profile-steps {start}-{stop} lies outside this run's iterations "
            f"{loaded_step}-{loaded_step + steps - 1} (it resumes at {loaded_step}); "
            "profile steps in that range or pass more --steps")
    return found, [f"ignoring interrupted checkpoint save {partial}" for partial in skipped]


def _experiments_root(req: RunRequest, cluster: dict) -> Path:
    """--root (or TRAINBENCH_ROOT), else the config's, else .: resolved, and refused in
    one line when it cannot be used (experiment.checked_root)."""
    try:
        return (experiments_root(cluster) if req.root is None
                else checked_root(req.root, "--root (or TRAINBENCH_ROOT)"))
    except RootError as err:
        raise RunRequestError(str(err)) from None


def _check_where_the_run_is_recorded(req: RunRequest, root: Path) -> None:

    # A Slurm job writes its experiment under the same root: a full disk stops it too.
    problem = root_problem(root) or disk_space_problem(root)
    if problem:
        raise RunRequestError(problem)
    if req.executor == "local":
        try:
            JobsDB.check(root)
        except JobsDBError as err:
            raise RunRequestError(str(err)) from None


def local_problem(planned: PlannedRun) -> str | None:
    """What stops a planned local run on this machine: devices, memory (the disk was
    checked with the root, in plan_run)."""
    plan = planned.plan
    return cpu_memory_problem(plan) if plan.device == "cpu" else local_gpu_problem(plan)


@dataclass(frozen=True)
class StartedRun:
    plan: Plan
    exp_dir: Path
    job_id: int
    db: object


def create_local_experiment(planned: PlannedRun) -> StartedRun:
    """The experiment directory, its plan.json and a RUNNING job row, or none of them."""
    root, exp_dir = planned.root, None
    try:
        db = JobsDB(root)
        exp_dir = new_experiment_dir(root, planned.plan.name)
        plan = replace(planned.plan, out_dir=str(exp_dir))
        (exp_dir / PLAN_FILE).write_text(plan.to_json())
        job_id = db.add("local", str(os.getpid()), plan.name, str(exp_dir), plan.to_json(),
                        "RUNNING")
    except (OSError, JobsDBError) as err:
        # Nothing has run: the directory would hold only a plan nobody executed.
        if exp_dir is not None:
            shutil.rmtree(exp_dir, ignore_errors=True)
        raise RunRequestError(str(err) if isinstance(err, JobsDBError) else
                              f"cannot create the experiment under {root}: {err.strerror}") from None
    return StartedRun(plan=plan, exp_dir=exp_dir, job_id=job_id, db=db)


def finish_local(started: StartedRun, interrupts=None) -> tuple[int, object, dict]:
    """Run the created experiment here; (exit code, parsed result, exit record). Signals
    are held (local.Interrupts: the caller's, else one of its own) until the job's row
    has its exit code: a Ctrl-C, or two, stop the run but never its records."""
    with contextlib.ExitStack() as stack:
        guard = interrupts if interrupts is not None else stack.enter_context(Interrupts())
        code = run_local(started.plan, started.exp_dir, interrupts=guard)
        ended = exit_record(started.exp_dir) or {}
        # Parsed once: the job history keeps what the summary prints.
        result = summarize_experiment(started.exp_dir)
        started.db.update(started.job_id, state="COMPLETED" if code == 0 else "FAILED",
                          exit_code=code, elapsed_s=ended.get("elapsed_s"),
                          results=result.to_dict())
    return code, result, ended


def local_gpu_problem(plan: Plan) -> str | None:
    """A local GPU run needs one GPU per rank on this machine."""
    have = len(gpu_names())
    if have == 0:
        return (f"the plan runs on {plan.gpu_type} GPUs but this machine has no NVIDIA GPU; "
                "use --gpu cpu (with a tiny size), --executor slurm, or --dry-run")
    if plan.gpus > have:
        return (f"the plan needs {plan.gpus} GPUs but this machine has {have}; use "
                "--executor slurm for a multi-node run, or a smaller --scale")
    return None


def available_memory_bytes() -> int | None:
    """MemAvailable of this machine (Linux), None where it cannot be read."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cpu_memory_problem(plan: Plan) -> str | None:
    """A CPU run whose ranks together would not fit this machine's memory is refused
    before it starts: the alternative is the kernel's OOM killer, or a frozen machine."""
    available = available_memory_bytes()
    if available is None:
        return None
    needed = tensor_bytes(plan) * plan.gpus
    if needed <= 0.8 * available:
        return None
    gib = 2.0 ** 30
    return (f"{plan.model.name} on {plan.gpus} CPU processes needs about {needed / gib:.0f} GiB "
            f"of memory but this machine has {available / gib:.0f} GiB available; use a tiny "
            f"size (-s tiny), a GPU machine, or --dry-run to plan it")
