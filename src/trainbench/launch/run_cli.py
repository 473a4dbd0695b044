"""`trainbench run`: plan a workload, then run it here (torchrun) or on Slurm.

The seeds' environment variables (DTYPE, MODEL_SIZE, JOB_TOTAL_GPUS, GPUS_PER_NODE,
ENABLE_PROFILE, PROFILE_START_STEP, PROFILE_STOP_STEP, ENABLE_NCCLTRACE,
ENABLE_CHECKPOINT, LOAD_CHECKPOINT_PATH) are defaults for the matching options.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..console import console, fail
from ..layout import rank_rows
from ..plan import compile_label, dp_sharding_label, performance_notes
from ..predict.memory import check_memory
from ..results.predicted import predicted_line
from ..results.summary import NO_PEAK_CPU_FP8
from .local import Interrupts
from .request import (RunRequest, RunRequestError, create_local_experiment, finish_local,
                      local_problem, plan_run)
from .sbatch import launch_on_slurm, submit_plan
from .slurm import SlurmError, SlurmOptions


def register(app: typer.Typer) -> None:
    @app.command()
    def run(
        workload: str = typer.Option(..., "-w", "--workload", help="Workload key, e.g. pretrain_llama3.1."),
        size: str = typer.Option(..., "-s", "--size", envvar="MODEL_SIZE", help="Model size, e.g. 8b or tiny."),
        dtype: Optional[str] = typer.Option(None, "--dtype", envvar="DTYPE",
                                            help="bf16, fp8, mxfp8 (Blackwell) or fp32; default bf16 on "
                                                 "a GPU or a CPU with native bf16, fp32 on other "
                                                 "CPUs."),
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
        no_check: bool = typer.Option(False, "--no-check",
                                      help="Skip building rank 0 and the last rank under a fake "
                                           "process group before submitting a multi-node plan."),
        force: bool = typer.Option(False, "--force",
                                   help="Launch even where the memory model predicts the plan "
                                        "does not fit the GPU (refused otherwise)."),
    ):
        """Plan a workload and train it: here with torchrun, or on Slurm."""
        execute(RunRequest(
            workload=workload, size=size, scale=scale, dtype=dtype, gpu=gpu,
            gpus_per_node=gpus_per_node, steps=steps, settings=tuple(settings),
            peak_tflops=peak_tflops, root=root, env=tuple(env), dry_run=dry_run,
            executor=executor, profile=profile, profile_steps=profile_steps,
            profile_ranks=profile_ranks, nccl_trace=nccl_trace, checkpoint=checkpoint,
            checkpoint_interval=checkpoint_interval, load_checkpoint=load_checkpoint,
            slurm=SlurmOptions(account=account, partition=partition, time_limit=time_limit,
                               nodelist=nodelist, exclude=exclude, reservation=reservation,
                               exclusive=exclusive, gres=gres, extra_args=tuple(slurm_args))),
                preflight=not no_check, force=force)


def _refuse(problems) -> None:
    for problem in problems:
        typer.echo(f"trainbench: error: {problem}", err=True)
    raise typer.Exit(2)


def execute(req, preflight: bool = True, force: bool = False) -> None:
    """Plan the request, print the plan, then dry-run, submit or run it, and print what
    came back. Every refusal is one line per problem and exit code 2."""
    try:
        planned = plan_run(req)
    except RunRequestError as err:
        _refuse(err.problems)
    for note in planned.notes:
        typer.echo(f"trainbench: note: {note}", err=True)
    plan = planned.plan
    out = console()
    print_plan(out, plan)
    if planned.dtype_reason:
        out.print(f"dtype: {plan.dtype} ({planned.dtype_reason})", highlight=False)
    fits = warn_if_predicted_not_to_fit(out, plan, planned.cluster)
    if not (fits or force or req.dry_run):
        # A certain out-of-memory crash costs a whole allocation (and its queue wait).
        _refuse([f"{plan.name} is predicted not to fit the {plan.gpu_type}'s memory (above); "
                 "change the layout or pass --force to launch it anyway"])
    if req.executor == "slurm":
        submit(out, req, planned, preflight)
        return
    if req.dry_run:
        print_rank_layout(out, plan)
        out.print("dry run: nothing launched")
        return

    # From the experiment's creation until its records are written, a Ctrl-C (or two)
    # stops the run but never leaves it without exit.json and the job's exit code.
    with Interrupts() as interrupts:
        try:
            problem = local_problem(planned)  # before anything is created
            if problem:
                raise RunRequestError(problem)
            started = create_local_experiment(planned)
        except RunRequestError as err:
            _refuse(err.problems)
        out.print(f"experiment directory: {started.exp_dir}")
        code, result, ended = finish_local(started, interrupts)
    print_summary(out, result)
    if code != 0:
        reason = ended.get("reason", f"exit code {code}")
        # The launcher ends as exit.json says it did (130 after a Ctrl-C, ...).
        fail(f"run failed: {reason}; log kept in {started.exp_dir}", code=code)


def submit(out, req, planned, preflight: bool = True) -> None:
    """A planned run on Slurm: the job script printed (dry run) or submitted."""
    plan, opts = planned.plan, req.slurm
    try:
        if req.dry_run:
            print_rank_layout(out, plan)
            launch_on_slurm(plan, planned.root / "experiments" / plan.name / "DRY-RUN",
                            opts, planned.cluster, dry_run=True)
            out.print("dry run: nothing submitted")
            return
        if preflight and plan.num_nodes > 1:
            # A shape bug in the real model costs seconds here, not a queue wait on many nodes.
            # (check builds the model with torch, which `--help` must not import.)
            from ..check.preflight import preflight_problem, preflight_ranks
            ranks = " and ".join(str(r) for r in preflight_ranks(plan))
            problem = preflight_problem(plan)
            if problem:
                fail(f"{problem}; fix the plan, or skip this check with --no-check")
            out.print(f"ranks {ranks} build (fake process group, meta device)", highlight=False)
        exp_dir, job_id = submit_plan(plan, planned.root, opts, planned.cluster)
    except SlurmError as err:
        _refuse(err.problems)
    except ValueError as err:
        fail(str(err))
    out.print(f"submitted Slurm job {job_id}; experiment directory {exp_dir}")


def print_plan(out, plan) -> None:
    lay = plan.layout
    out.print(f"[bold]{plan.name}[/bold]: {plan.model.name}, {plan.dtype}, {plan.gpus} ranks on "
              f"{plan.num_nodes} node(s) of {plan.gpus_per_node} ({plan.gpu_type})")
    out.print(f"layout {lay.describe()}  MBS {plan.mbs}  GBS {plan.gbs}  GA {plan.ga}  "
              f"seq {plan.seq_len}  steps {plan.steps}  recompute {plan.recompute}  "
              f"compile {compile_label(plan)}")
    if plan.recipe_note:
        out.print(f"[yellow]note:[/yellow] {plan.recipe_note}")
    for note in performance_notes(plan):
        out.print(f"[yellow]note:[/yellow] {note}", highlight=False)


def print_rank_layout(out, plan) -> None:
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


def warn_if_predicted_not_to_fit(out, plan, config: dict | None = None) -> bool:
    """The memory model's figure before launching: the same line `trainbench predict`
    prints for this plan (trainbench's engine, FSDP2), a warning when it does not fit,
    and the data-parallel sharding and gradient dtype the plan runs and what chose them.
    False where the plan is predicted not to fit (run refuses it without --force)."""
    m, line = check_memory(plan, config=config)
    fits = not (m is not None and m.fits is False)
    if fits:
        out.print(line, highlight=False)
    else:
        out.print(f"[yellow]warning: {line}[/yellow]", highlight=False)
    if plan.gpus > 1:
        out.print(f"data-parallel sharding: {dp_sharding_label(plan)}", highlight=False)
    if plan.adam_moments == "bf16" and plan.master_weights == "bf16":
        out.print("AdamW moments and master weights: bf16, no fp32 copy (as Apex's "
                  "DistributedFusedAdam with bf16 state keeps them)", highlight=False)
    elif plan.adam_moments == "bf16":
        out.print("AdamW moments: bf16 (the recipe's precision-aware optimizer; master weights "
                  "fp32)", highlight=False)
    return fits


def print_summary(out, r) -> None:
    """A run's window statistics and metrics (an ExperimentResult), next to the reference
    where one exists."""
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
    elif r.peak_source == NO_PEAK_CPU_FP8:
        row("MFU", "not applicable: FP8 on a CPU is an emulation, for correctness only")
    else:
        row(f"MFU ({r.mfu_convention} FLOPs, peak {r.peak_source})",
            None if r.mfu_pct is None else f"{r.mfu_pct:.2f}% of {r.peak_tflops:.4g} TFLOPS")
    row("days per 1T tokens", r.days_per_1t_tokens, "{:,.1f}")
    row("peak memory (GiB)", r.peak_memory_gib, "{:.2f}")
    if r.energy_per_token_j is not None:  # run.json's telemetry says what it covers
        row("energy per token (J)", r.energy_per_token_j, "{:.4g}")
    if r.throttled:
        row("clocks", "THROTTLED during the timed window (see the notes)")
    if r.gpu_shared:
        row("GPU", "SHARED with another process during the timed window (see the notes)")
    if r.profiling_overhead:  # profiled steps against the window's unprofiled ones
        row("profiling overhead", r.profiling_overhead)
    if r.straggler:  # a rank's compute time > 5% above the median rank's
        row("STRAGGLER", r.straggler)
    elif r.rank_compute_spread_pct is not None:
        row("slowest rank's compute vs median", f"{r.rank_compute_spread_pct:+.1f}% "
            "(within 5%: no straggler)")
    if r.predicted_step_time_s is not None:  # a GPU run: predict for this very plan
        row("predict for this plan", predicted_line(r))
    if r.ref_step_time_s is not None:
        row("reference step time (s)", r.ref_step_time_s)
        row("% of reference tokens/s", r.pct_of_ref_tokens_per_s, "{:.1f}%")
    row("verdict", r.verdict)
    out.print(table)
