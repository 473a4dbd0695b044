"""`trainbench run`: plan a workload, then run it here (torchrun) or on Slurm.

The seeds' environment variables (DTYPE, MODEL_SIZE, JOB_TOTAL_GPUS, GPUS_PER_NODE,
ENABLE_PROFILE, PROFILE_START_STEP, PROFILE_STOP_STEP, ENABLE_NCCLTRACE,
ENABLE_CHECKPOINT, LOAD_CHECKPOINT_PATH) are defaults for the matching options.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional

import typer

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
    from ..catalog import hardware
    names = gpu_names()
    if not names:
        return hardware.CPU, "CPU"
    gpu = hardware.gpu_from_device_name(names[0])
    return (gpu.key if gpu else ""), names[0]


def parse_ranks(text: str, scale: int) -> tuple[int, ...]:
    """'0,1' -> (0, 1); 'all' -> every rank; ValueError with the fix otherwise."""
    if text.strip().lower() == "all":
        return tuple(range(scale))
    try:
        ranks = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise ValueError(f"--profile-ranks {text!r}: use rank numbers like 0,1 or 'all'") from None
    bad = [r for r in ranks if not 0 <= r < scale]
    if not ranks or bad:
        raise ValueError(f"--profile-ranks {text!r}: ranks must be in 0-{scale - 1}")
    return ranks


_TRUE = ("1", "true", "t", "yes", "y", "on")
_FALSE = ("", "0", "false", "f", "no", "n", "off")


def env_flag(name: str) -> bool:
    """A boolean environment variable, read as click reads ENABLE_CHECKPOINT; ValueError
    for anything else (ENABLE_PROFILE=maybe is refused, not read as false)."""
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise ValueError(f"{name}={os.environ[name]!r} is not a boolean; use true or false")


def env_int(name: str, default: int) -> int:
    """An integer environment variable (PROFILE_START_STEP, ...); ValueError naming it."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={os.environ[name]!r} is not an integer step number") from None


def register(app: typer.Typer) -> None:
    @app.command()
    def run(
        workload: str = typer.Option(..., "-w", "--workload", help="Workload key, e.g. pretrain_llama3.1."),
        size: str = typer.Option(..., "-s", "--size", envvar="MODEL_SIZE", help="Model size, e.g. 8b or tiny."),
        dtype: Optional[str] = typer.Option(None, "--dtype", envvar="DTYPE",
                                            help="bf16, fp8 or fp32; default bf16 on a GPU or a "
                                                 "CPU with native bf16, fp32 on other CPUs."),
        scale: int = typer.Option(..., "--scale", envvar="JOB_TOTAL_GPUS",
                                  help="Number of ranks: GPUs, or processes on a CPU machine."),
        gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU type (h100, b200, ..., cpu); "
                                          "default: detected on this machine."),
        gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", envvar="GPUS_PER_NODE"),
        steps: Optional[int] = typer.Option(None, "--steps", help="Training steps (default 50; "
                                            "25 when profiling, 5 with --nccl-trace, 1 after a load)."),
        settings: List[str] = typer.Option([], "--set", help="Override the recipe: --set 'tp=2 gbs=64'."),
        peak_tflops: Optional[float] = typer.Option(None, "--peak-tflops",
                                                    help="Peak dense TFLOPS of a device the catalog does not know."),
        root: Optional[Path] = typer.Option(None, "--root", envvar="TRAINBENCH_ROOT",
                                            help="Where experiments/ lives (default: the cluster config's, else .)."),
        env: List[str] = typer.Option([], "--env", help="K=V for the ranks' environment (repeatable)."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Plan and print; run nothing."),
        executor: str = typer.Option("local", "--executor", help="local or slurm."),
        profile: str = typer.Option("", "--profile", help="'torch' or 'nsys' to profile steps."),
        profile_steps: Optional[str] = typer.Option(None, "--profile-steps", help="A-B, e.g. 20-25."),
        profile_ranks: str = typer.Option("0", "--profile-ranks", help="Ranks to profile: 0,1 or all."),
        nccl_trace: bool = typer.Option(False, "--nccl-trace", envvar="ENABLE_NCCLTRACE",
                                        help="Trace collectives over the first 5 steps."),
        checkpoint: bool = typer.Option(False, "--checkpoint", envvar="ENABLE_CHECKPOINT",
                                        help="Save a distributed checkpoint at the end."),
        checkpoint_interval: int = typer.Option(0, "--checkpoint-interval", help="Also save every N steps."),
        load_checkpoint: Optional[str] = typer.Option(None, "--load-checkpoint", envvar="LOAD_CHECKPOINT_PATH",
                                                      help="Restore this checkpoint, then train."),
        account: Optional[str] = typer.Option(None, "--account", help="Slurm account."),
        partition: Optional[str] = typer.Option(None, "--partition", help="Slurm partition."),
        time_limit: str = typer.Option("00:30:00", "--time-limit", help="Slurm time limit."),
        nodelist: Optional[str] = typer.Option(None, "--nodelist"),
        exclude: Optional[str] = typer.Option(None, "--exclude"),
        reservation: Optional[str] = typer.Option(None, "--reservation"),
        exclusive: bool = typer.Option(True, "--exclusive/--no-exclusive"),
        gres: Optional[str] = typer.Option(None, "--gres", help="e.g. gpu:8; default none."),
        slurm_args: List[str] = typer.Option([], "--slurm-arg", help="Extra sbatch argument (repeatable)."),
    ):
        """Plan a workload and train it: here with torchrun, or on Slurm."""
        from ..cli import console, fail
        from ..plan import Features, PlanError, build_plan, parse_overrides
        from .experiment import PLAN_FILE, new_experiment_dir

        if executor not in ("local", "slurm"):
            fail(f"unknown executor {executor!r}; use local or slurm")
        if scale < 1:
            fail(f"--scale {scale}: the scale is the number of ranks (GPUs, or processes on a "
                 "CPU) and must be at least 1")
        try:
            profile_env = env_flag("ENABLE_PROFILE")
            env_start = env_int("PROFILE_START_STEP", 20)
            env_stop = env_int("PROFILE_STOP_STEP", 25)
        except ValueError as err:
            fail(str(err))
        if profile == "" and profile_env:
            profile = "torch"
        if profile not in ("", "torch", "nsys"):
            fail(f"unknown profiler {profile!r}; use torch or nsys")
        start, stop = 20, 25
        if profile_steps:
            from ..metrics import parse_window
            try:
                start, stop = parse_window(profile_steps)
            except ValueError as err:
                fail(str(err).replace("window", "--profile-steps"))
        else:
            start, stop = env_start, env_stop
        if steps is None:
            steps = 1 if load_checkpoint else 5 if nccl_trace else max(25, stop + 1) if profile else 50
        from ..config import load_config
        from .slurm import cluster_env, parse_env_items
        try:
            # Secrets never enter plan.json or a job script, whatever the executor: the
            # ranks inherit them from this shell instead.
            env_vars = parse_env_items(env, "--env")
            overrides = parse_overrides(settings)
            cluster = load_config()
        except PlanError as err:
            for problem in err.problems:
                typer.echo(f"trainbench: error: {problem}", err=True)
            raise typer.Exit(2)
        except ValueError as err:
            fail(str(err).splitlines()[0])
        if executor == "local":
            # The same rules as for a job script: a config must not make the ranks load code.
            from .slurm import SlurmError, check_env
            try:
                cluster_pairs = cluster_env(cluster)
            except SlurmError as err:
                fail(err.problems[0])
            bad = check_env(cluster_pairs, "cluster config env")
            if bad:
                fail(bad[0])
            env_vars = {**dict(cluster_pairs), **env_vars}
        else:
            gpu = gpu or cluster.get("gpu_type")
            gpus_per_node = gpus_per_node or cluster.get("gpus_per_node")
        loaded_step = 0
        if load_checkpoint:
            # Resolved here, before anything launches: a folder without a complete
            # checkpoint is an error, never a silent fresh start.
            from ..engine.checkpoint_dirs import CheckpointError, resolve
            try:
                found, skipped = resolve(load_checkpoint)
            except CheckpointError as err:
                fail(str(err))
            for partial in skipped:
                typer.echo(f"trainbench: note: ignoring interrupted checkpoint save {partial}",
                           err=True)
            load_checkpoint, loaded_step = str(found.path.resolve()), found.step
            if profile and not (loaded_step <= start and stop < loaded_step + steps):
                fail(f"--profile-steps {start}-{stop} lies outside this run's iterations "
                     f"{loaded_step}-{loaded_step + steps - 1} (it resumes at {loaded_step}); "
                     "profile steps in that range or pass more --steps")
        try:
            ranks_to_profile = parse_ranks(profile_ranks, scale)
        except ValueError as err:
            fail(str(err))
        gpu_type = gpu
        if gpu_type is None:
            gpu_type, device_name = detect_gpu_type()
            if not gpu_type and peak_tflops is None:
                fail(f"this machine's GPU {device_name!r} is not in the catalog; pass "
                     "--peak-tflops and --gpu NAME")
            gpu_type = gpu_type or re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
        dtype_why = None
        if dtype is None:
            from ..default_dtype import default_dtype_for
            dtype, dtype_why = default_dtype_for(workload, size, gpu_type)
        features = Features(profile=profile, profile_start=start, profile_stop=stop,
                            profile_ranks=ranks_to_profile,
                            nccl_trace=nccl_trace, checkpoint=checkpoint,
                            checkpoint_interval=checkpoint_interval,
                            load_checkpoint=load_checkpoint or "")
        try:
            plan = build_plan(workload, size, dtype, scale, gpu_type, overrides=overrides,
                              steps=steps, features=features, peak_tflops=peak_tflops,
                              gpus_per_node=gpus_per_node, env=env_vars)
        except PlanError as err:
            for problem in err.problems:
                typer.echo(f"trainbench: error: {problem}", err=True)
            raise typer.Exit(2)
        if load_checkpoint:
            # The model this plan builds (overrides included) against the one saved.
            from ..engine.checkpoint_dirs import CheckpointError, check_model
            try:
                check_model(found, workload, size, plan.model)
            except CheckpointError as err:
                fail(str(err))
        if profile == "nsys" and executor == "local" and not shutil.which("nsys"):
            fail("--profile nsys: nsys (Nsight Systems) is not on PATH; install it or use "
                 "--profile torch")

        if root is None:
            from .jobs import experiments_root
            root = experiments_root(cluster)
        if not dry_run:
            # Where the run will be recorded is checked with everything else, before the
            # plan is printed or anything is created.
            from .experiment import root_problem
            from .jobs import JobsDB, JobsDBError
            problem = root_problem(root)
            if problem:
                fail(problem)
            if executor == "local":
                try:
                    JobsDB.check(root)
                except JobsDBError as err:
                    fail(str(err))

        out = console()
        print_plan(out, plan)
        if dtype_why:
            out.print(f"dtype: {plan.dtype} ({dtype_why})", highlight=False)
        warn_if_predicted_not_to_fit(out, plan, cluster)
        if executor == "slurm":
            from .slurm import SlurmError, SlurmOptions, launch_on_slurm, submit_plan
            opts = SlurmOptions(account=account, partition=partition, time_limit=time_limit,
                                nodelist=nodelist, exclude=exclude, reservation=reservation,
                                exclusive=exclusive, gres=gres, extra_args=tuple(slurm_args))
            try:
                if dry_run:
                    print_rank_layout(out, plan)
                    launch_on_slurm(plan, Path(root) / "experiments" / plan.name / "DRY-RUN",
                                    opts, cluster, dry_run=True)
                    out.print("dry run: nothing submitted")
                    return
                exp_dir, job_id = submit_plan(plan, Path(root), opts, cluster)
            except SlurmError as err:
                for problem in err.problems:
                    typer.echo(f"trainbench: error: {problem}", err=True)
                raise typer.Exit(2)
            except ValueError as err:
                fail(str(err))
            out.print(f"submitted Slurm job {job_id}; experiment directory {exp_dir}")
            return
        if dry_run:
            print_rank_layout(out, plan)
            out.print("dry run: nothing launched")
            return
        from .local import disk_space_problem
        problem = cpu_memory_problem(plan) if plan.device == "cpu" else local_gpu_problem(plan)
        problem = problem or disk_space_problem(root)  # before anything is created
        if problem:
            fail(problem)
        from dataclasses import replace

        from ..results import summarize_experiment
        from .jobs import exit_record
        from .local import run_local
        exp_dir = None
        try:
            db = JobsDB(root)
            exp_dir = new_experiment_dir(root, plan.name)
            plan = replace(plan, out_dir=str(exp_dir))
            (exp_dir / PLAN_FILE).write_text(plan.to_json())
            job_id = db.add("local", str(os.getpid()), plan.name, str(exp_dir), plan.to_json(),
                            "RUNNING")
        except (OSError, JobsDBError) as err:
            # Nothing has run: the directory would hold only a plan nobody executed.
            if exp_dir is not None:
                shutil.rmtree(exp_dir, ignore_errors=True)
            fail(str(err) if isinstance(err, JobsDBError) else
                 f"cannot create the experiment under {root}: {err.strerror}")
        out.print(f"experiment directory: {exp_dir}")
        code = run_local(plan, exp_dir)
        ended = exit_record(exp_dir) or {}
        # Parsed once: the job history keeps what the summary prints.
        result = summarize_experiment(exp_dir)
        db.update(job_id, state="COMPLETED" if code == 0 else "FAILED", exit_code=code,
                  elapsed_s=ended.get("elapsed_s"), results=result.to_dict())
        print_summary(out, result)
        if code != 0:
            reason = ended.get("reason", f"exit code {code}")
            # The launcher ends as exit.json says it did (130 after a Ctrl-C, ...).
            fail(f"run failed: {reason}; log kept in {exp_dir}", code=code)


def print_plan(out, plan) -> None:
    lay = plan.layout
    out.print(f"[bold]{plan.name}[/bold]: {plan.model.name}, {plan.dtype}, {plan.gpus} ranks on "
              f"{plan.num_nodes} node(s) of {plan.gpus_per_node} ({plan.gpu_type})")
    out.print(f"layout {lay.describe()}  MBS {plan.mbs}  GBS {plan.gbs}  GA {plan.ga}  "
              f"seq {plan.seq_len}  steps {plan.steps}  recompute {plan.recompute}")
    if plan.recipe_note:
        out.print(f"[yellow]note:[/yellow] {plan.recipe_note}")


def print_rank_layout(out, plan) -> None:
    from rich.table import Table

    from ..layout import rank_rows
    lay = plan.layout
    table = Table(title=f"Per-rank layout ({plan.gpus} ranks"
                  + (f"; the first rank of each pipeline stage, standing for its "
                     f"{lay.tp * lay.cp * lay.dp} TP x CP x DP ranks, and the last rank)"
                     if plan.gpus > 32 else ")"))
    rows = rank_rows(plan)
    for col in rows[0]:
        table.add_column(col)
    for row in rows:
        table.add_row(*row.values())
    out.print(table)


def warn_if_predicted_not_to_fit(out, plan, config: dict | None = None) -> None:
    """The memory model's figure before launching: the same line `trainbench predict`
    prints for this plan (trainbench's engine, FSDP2), a warning when it does not fit."""
    from ..predict.memory import check_memory
    m, line = check_memory(plan, config=config)
    if m is not None and m.fits is False:
        out.print(f"[yellow]warning: {line}[/yellow]", highlight=False)
    else:
        out.print(line, highlight=False)


def local_gpu_problem(plan) -> str | None:
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


def cpu_memory_problem(plan) -> str | None:
    """A CPU run whose ranks together would not fit this machine's memory is refused
    before it starts: the alternative is the kernel's OOM killer, or a frozen machine."""
    from ..predict.memory import tensor_bytes
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


def print_summary(out, r) -> None:
    """A run's window statistics and metrics (an ExperimentResult), next to the reference
    where one exists."""
    from rich.markup import escape
    from rich.table import Table

    # Log text (error lines quote paths like "[/src/...]") is never read as rich markup.
    table = Table(title=escape(f"{r.name}: {r.status}" + (f" ({r.status_detail})"
                                                           if r.status_detail else "")),
                  show_header=False)
    table.add_column("metric")
    table.add_column("value")

    def row(label: str, value, fmt: str = "{}") -> None:
        table.add_row(escape(label), "-" if value is None else escape(fmt.format(value)))

    row("layout", r.layout)
    if r.window_start is not None:
        row(f"step time, iterations {r.window_start}-{r.window_end} (s)",
            None if r.step_time_mean_s is None else
            f"{r.step_time_mean_s:.4f} ± {r.step_time_std_s:.4f} (mean ± sample std, "
            f"{r.window_count} steps)")
    row("tokens/s", r.tokens_per_s, "{:,.1f}")
    row("tokens/s per GPU", r.tokens_per_s_per_gpu, "{:,.1f}")
    row("TFLOPS/GPU", r.tflops_per_gpu, "{:.4g}")
    if r.mfu_problem:  # an impossible MFU is never printed as a figure
        row("MFU", r.mfu_problem)
    else:
        row(f"MFU ({r.mfu_convention} FLOPs, peak {r.peak_source})",
            None if r.mfu_pct is None else f"{r.mfu_pct:.2f}% of {r.peak_tflops:.4g} TFLOPS")
    row("days per 1T tokens", r.days_per_1t_tokens, "{:,.1f}")
    row("peak memory (GiB)", r.peak_memory_gib, "{:.2f}")
    if r.ref_step_time_s is not None:
        row("reference step time (s)", r.ref_step_time_s)
        row("% of reference tokens/s", r.pct_of_ref_tokens_per_s, "{:.1f}%")
    row("verdict", r.verdict)
    out.print(table)
