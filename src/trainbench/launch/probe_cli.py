"""`trainbench probe`: GEMMs, memory bandwidth and collectives on this machine (torchrun)
or a Slurm allocation, with a health verdict. Importing this module imports no torch: the
ranks do (probe/worker.py)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ..console import console, fail
from ..probe.profile import PLOT_FILE, PROFILE_FILE, ProbeError, fmt_bytes, load_profile
from ..probe.report import plot_profile, print_profile
from .probe import (ProbeRequest, create_probe_dir, plan_probe, render_slurm, run_local,
                    submit_slurm, torchrun_command)
from .slurm import SlurmError, SlurmOptions, SubmitError


def register(app: typer.Typer) -> None:
    @app.command()
    def probe(
        scale: Optional[int] = typer.Option(None, "--scale", envvar="JOB_TOTAL_GPUS",
                                            help="Number of ranks: GPUs, or processes on a CPU."),
        gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU type (h100, b200, ..., cpu); "
                                          "default: detected on this machine."),
        gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", envvar="GPUS_PER_NODE"),
        nodes: Optional[int] = typer.Option(None, "--nodes", help="Nodes (Slurm); default: "
                                            "scale / GPUs per node."),
        root: Optional[Path] = typer.Option(None, "--root", envvar="TRAINBENCH_ROOT",
                                            help="Where probes/ lives (default: the cluster "
                                                 "config's experiments root, else .)."),
        executor: str = typer.Option("local", "--executor", help="local or slurm."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Plan and print; run nothing."),
        min_size: Optional[str] = typer.Option(None, "--min-size",
                                               help="Smallest message, e.g. 1K (default 1 KiB)."),
        max_size: Optional[str] = typer.Option(None, "--max-size",
                                               help="Largest message, e.g. 64M (default 1 GiB "
                                                    "on GPUs, 4 MiB on a CPU)."),
        report: Optional[Path] = typer.Option(None, "--report", help="Print the tables of an "
                                              "existing probe directory (or its profile) and "
                                              "draw its plot if missing; measure nothing."),
        account: Optional[str] = typer.Option(None, "--account", help="Slurm account."),
        partition: Optional[str] = typer.Option(None, "--partition", help="Slurm partition."),
        time_limit: str = typer.Option("00:30:00", "--time-limit", help="Slurm time limit."),
        nodelist: Optional[str] = typer.Option(None, "--nodelist"),
        exclude: Optional[str] = typer.Option(None, "--exclude"),
        reservation: Optional[str] = typer.Option(None, "--reservation"),
        exclusive: bool = typer.Option(True, "--exclusive/--no-exclusive"),
        gres: Optional[str] = typer.Option(None, "--gres", help="e.g. gpu:8; default none."),
        slurm_args: List[str] = typer.Option([], "--slurm-arg",
                                             help="Extra sbatch argument (repeatable)."),
    ):
        """Measure GEMMs, memory bandwidth and collectives on every rank; name slow ones."""
        if report is not None:
            show(report)
            return
        if scale is None:
            fail("--scale is required: the number of ranks to probe (e.g. --scale 8), or "
                 "--report DIR to show an earlier probe")
        execute(ProbeRequest(
            scale=scale, gpu=gpu, nodes=nodes, gpus_per_node=gpus_per_node, root=root,
            executor=executor, dry_run=dry_run, min_size=min_size, max_size=max_size,
            slurm=SlurmOptions(account=account, partition=partition, time_limit=time_limit,
                               nodelist=nodelist, exclude=exclude, reservation=reservation,
                               exclusive=exclusive, gres=gres, extra_args=tuple(slurm_args),
                               job_name=None)))


def show(path: Path) -> None:
    try:
        profile = load_profile(path)
    except ProbeError as err:
        fail(str(err))
    directory = path if path.is_dir() else path.parent
    print_profile(console(), profile, directory)
    if not (directory / PLOT_FILE).exists():
        try:
            plot_profile(profile, directory / PLOT_FILE)
        except OSError as err:
            fail(f"cannot write {directory / PLOT_FILE}: {err.strerror}")


def execute(req) -> None:
    try:
        planned = plan_probe(req)
    except ProbeError as err:
        fail(str(err))
    plan, out = planned.plan, console()
    out.print(f"[bold]{plan['name']}[/bold]: {plan['scale']} ranks on {plan['nodes']} node(s) "
              f"of {plan['ranks_per_node']} ({plan['gpu_type']}); GEMMs in "
              f"{', '.join(plan['dtypes'])} at {len(plan['gemm_shapes'])} seed shapes; "
              f"collectives {fmt_bytes(plan['sizes'][0])} to {fmt_bytes(plan['sizes'][-1])}",
              highlight=False)
    if req.executor == "slurm":
        try:
            if req.dry_run:
                where = planned.root / "probes" / f"{plan['name']}_DRY-RUN"
                print(render_slurm(planned, where, req.slurm), end="")
                out.print("dry run: nothing submitted")
                return
            out_dir, job_id = submit_slurm(planned, req.slurm)
        except (SlurmError, ProbeError) as err:
            fail(err.problems[0] if isinstance(err, SlurmError) else str(err))
        except SubmitError as err:
            fail(str(err))
        out.print(f"submitted Slurm job {job_id}; probe directory {out_dir} (when it ends: "
                  f"trainbench probe --report {out_dir})", highlight=False)
        return
    if req.dry_run:
        out.print(" ".join(torchrun_command(plan, Path("PROBE_DIR") / "probe-plan.json")),
                  highlight=False, markup=False)
        out.print("dry run: nothing launched")
        return
    try:
        out_dir = create_probe_dir(planned)
    except ProbeError as err:
        fail(str(err))
    out.print(f"probe directory: {out_dir}", highlight=False)
    code, reason = run_local(plan, out_dir, echo=lambda line: out.print(
        line, highlight=False, markup=False))
    if code != 0:
        fail(f"probe failed: {reason}; log kept in {out_dir}", code=code)
    try:
        profile = load_profile(out_dir / PROFILE_FILE)
    except ProbeError as err:
        fail(f"{err}; see {out_dir / 'probe.log'}", code=1)
    print_profile(out, profile, out_dir / PROFILE_FILE)
    if (out_dir / PLOT_FILE).exists():
        out.print(f"plot: {out_dir / PLOT_FILE}", highlight=False)
