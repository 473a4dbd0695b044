"""A probe request checked and turned into a probe plan, then run with torchrun here or
submitted to Slurm; no torch here.

Everything is checked before anything is created: a refused probe leaves no directory.
A probe writes into `<root>/probes/<name>_<timestamp>/` (never an existing one):
probe-plan.json (what the ranks read), probe.log (all ranks' output), exit.json,
hardware-profile.json and bandwidth.png; on Slurm also the sbatch script.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from ..catalog import hardware
from ..config import load_config
from ..probe import profile as P
from ..rundir import creatable_problem, experiments_root, new_stamped_dir
from . import local
from .local import disk_space_problem, free_port
from .request import available_memory_bytes, detect_gpu_type, gpu_names
from .sbatch import render_sbatch, script_name, submit
from .slurm import SlurmError, SlurmOptions, SubmitError, check_options, warn_missing_settings

LOG_FILE = "probe.log"
# A copy much larger than any CPU's last-level cache, so that it measures memory.
CPU_COPY_BYTES = 256 * P.MIB
GPU_COPY_BYTES = P.GIB
# The sustained GEMM run (worker.Rank.sustained): long enough on a GPU for its clocks to
# settle at the power limit (Azure's benchmark guide warms up for 10,000 GEMMs, ~10 s at
# the seed shapes); on a CPU a token length, so that the tests exercise the path.
GPU_SUSTAIN_SECONDS = 10.0
CPU_SUSTAIN_SECONDS = 0.5
MAX_CPU_RANKS = 64


@dataclass(frozen=True)
class ProbeRequest:
    scale: int
    gpu: str | None = None
    """None: detected on this machine (for Slurm: the cluster config's)."""
    nodes: int | None = None
    gpus_per_node: int | None = None
    root: Path | None = None
    executor: str = "local"
    dry_run: bool = False
    min_size: str | None = None
    max_size: str | None = None
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


@dataclass(frozen=True)
class _NoFeatures:
    profile: str = ""
    nccl_trace: bool = False


@dataclass(frozen=True)
class ProbeJob:
    """What the Slurm renderer needs of a plan (launch/slurm.py reads these fields); the
    ranks run the probe's worker on probe-plan.json instead of the engine."""
    name: str
    gpus: int
    gpus_per_node: int
    num_nodes: int
    device: str
    env: tuple = ()
    features: _NoFeatures = field(default_factory=_NoFeatures)
    rank_program: tuple[str, str] = ("trainbench.probe.worker", P.PLAN_FILE)


@dataclass(frozen=True)
class PlannedProbe:
    plan: dict
    root: Path
    cluster: dict

    @property
    def job(self) -> ProbeJob:
        p = self.plan
        return ProbeJob(name=p["name"], gpus=p["scale"], gpus_per_node=p["ranks_per_node"],
                        num_nodes=p["nodes"], device="cpu" if p["device"] == "cpu" else "gpu")


def _gpu_type(req: ProbeRequest, cluster: dict) -> str:
    gpu = req.gpu or (cluster.get("gpu_type") if req.executor == "slurm" else None)
    if gpu:
        gpu = str(gpu).lower()
        if gpu != hardware.CPU and gpu not in hardware.GPUS:
            raise P.ProbeError(f"unknown GPU type {gpu!r}; use one of "
                               f"{', '.join(hardware.GPUS)} or cpu")
        return gpu
    gpu_type, device_name = detect_gpu_type()
    # The probe needs no catalog figure: an unknown GPU is measured under its own name.
    return gpu_type or "".join(c if c.isalnum() else "-" for c in device_name.lower()).strip("-")


def _layout(req: ProbeRequest, gpu_type: str, cluster: dict) -> tuple[int, int]:
    """(nodes, ranks per node)."""
    if req.nodes is not None and req.nodes < 1:
        raise P.ProbeError(f"--nodes {req.nodes}: use at least 1 node")
    if req.executor == "local":
        if req.nodes not in (None, 1):
            raise P.ProbeError(f"--nodes {req.nodes}: a local probe runs on this one machine; "
                               "use --executor slurm for several nodes")
        return 1, req.scale
    if req.nodes is not None:
        if req.scale % req.nodes:
            raise P.ProbeError(f"--scale {req.scale} does not divide into --nodes {req.nodes}; "
                               "give a scale that is a multiple of the node count")
        return req.nodes, req.scale // req.nodes
    per_node = req.gpus_per_node or cluster.get("gpus_per_node")
    if not per_node:
        per_node = (hardware.GPUS[gpu_type].gpus_per_node if gpu_type in hardware.GPUS
                    else req.scale)
    per_node = min(int(per_node), req.scale)
    if per_node < 1:
        raise P.ProbeError(f"--gpus-per-node {per_node}: use at least 1")
    if req.scale % per_node:
        raise P.ProbeError(f"--scale {req.scale} is not a whole number of nodes of {per_node}; "
                           "use a multiple of --gpus-per-node or pass --nodes")
    return req.scale // per_node, per_node


def plan_probe(req: ProbeRequest) -> PlannedProbe:
    """Everything a probe needs, checked before anything is created or printed."""
    if req.executor not in ("local", "slurm"):
        raise P.ProbeError(f"unknown executor {req.executor!r}; use local or slurm")
    if req.scale < 1:
        raise P.ProbeError(f"--scale {req.scale}: the scale is the number of ranks (GPUs, or "
                           "processes on a CPU) and must be at least 1")
    try:
        cluster = load_config()
    except ValueError as err:
        raise P.ProbeError(str(err).splitlines()[0]) from None
    gpu_type = _gpu_type(req, cluster)
    device = "cpu" if gpu_type == hardware.CPU else "cuda"
    if device == "cpu" and req.executor == "local" and req.scale > MAX_CPU_RANKS:
        raise P.ProbeError(f"--scale {req.scale}: at most {MAX_CPU_RANKS} CPU processes on "
                           "one machine")
    nodes, per_node = _layout(req, gpu_type, cluster)
    min_size = P.parse_size(req.min_size, "--min-size") if req.min_size else P.DEFAULT_MIN_SIZE
    max_size = (P.parse_size(req.max_size, "--max-size") if req.max_size else
                P.DEFAULT_MAX_SIZE_CPU if device == "cpu" else P.DEFAULT_MAX_SIZE_GPU)
    sizes = P.message_sizes(min_size, max_size)
    slow = P.parse_slow_rank(req.environ.get(P.SLOW_RANK_ENV))
    if slow and slow[0] >= req.scale:
        raise P.ProbeError(f"{P.SLOW_RANK_ENV}: rank {slow[0]} does not exist in a probe of "
                           f"{req.scale} ranks")
    if device == "cpu":
        dtypes = ["fp32", "bf16"]
    else:
        gpu = hardware.GPUS.get(gpu_type)
        dtypes = ["bf16"] + (["fp8"] if gpu and gpu.peak("fp8") else [])
    name = f"probe_{gpu_type}_ranks{req.scale}" + (f"_nodes{nodes}" if nodes > 1 else "")
    plan = {"schema": P.SCHEMA, "name": name, "gpu_type": gpu_type, "device": device,
            "scale": req.scale, "nodes": nodes, "ranks_per_node": per_node,
            "dtypes": dtypes, "gemm_shapes": P.gemm_shapes(device), "sizes": sizes,
            "attention": P.attention_shape(device), "scan": P.scan_shape(device),
            "memory_bytes": CPU_COPY_BYTES if device == "cpu" else GPU_COPY_BYTES,
            "sustain_seconds": CPU_SUSTAIN_SECONDS if device == "cpu" else GPU_SUSTAIN_SECONDS}
    root = req.root
    if root is None:
        root = experiments_root(cluster)
    root = Path(root)
    if not req.dry_run:
        problem = creatable_problem(root / "probes")
        if problem:
            raise P.ProbeError(f"probe root {root}: {problem}; pass --root (or "
                               "TRAINBENCH_ROOT) naming a writable directory")
        problem = disk_space_problem(root)
        if problem:
            raise P.ProbeError(problem)
        if req.executor == "local":
            problem = _local_problem(plan)
            if problem:
                raise P.ProbeError(problem)
    return PlannedProbe(plan=plan, root=root, cluster=cluster)


def _local_problem(plan: dict) -> str | None:
    if plan["device"] == "cpu":
        available = available_memory_bytes()
        # Per rank: the copy's two buffers and, at the largest size, a collective's
        # buffer, its output and a piece.
        need = plan["scale"] * (2 * plan["memory_bytes"] + 3 * plan["sizes"][-1])
        if available is not None and need > 0.8 * available:
            return (f"the probe's {plan['scale']} ranks need about {need / P.GIB:.1f} GiB of "
                    f"memory but {available / P.GIB:.1f} GiB are available; use a smaller "
                    "--scale or --max-size")
        return None
    have = len(gpu_names())
    if have == 0:
        return (f"a {plan['gpu_type']} probe needs NVIDIA GPUs but this machine has none; use "
                "--gpu cpu, --executor slurm, or --dry-run")
    if plan["scale"] > have:
        return (f"--scale {plan['scale']} needs {plan['scale']} GPUs but this machine has "
                f"{have}; use a smaller --scale or --executor slurm")
    return None


def new_probe_dir(root: Path, name: str) -> Path:
    """A fresh `<root>/probes/<name>_<timestamp>[-n]`; an existing one is never reused."""
    try:
        return new_stamped_dir(Path(root) / "probes", name)
    except RuntimeError as err:
        raise P.ProbeError(str(err)) from None


def create_probe_dir(planned: PlannedProbe) -> Path:
    out_dir = None
    try:
        out_dir = new_probe_dir(planned.root, planned.plan["name"])
        (out_dir / P.PLAN_FILE).write_text(json.dumps({**planned.plan,
                                                       "out_dir": str(out_dir)}, indent=2))
    except OSError as err:
        if out_dir is not None:
            _remove(out_dir)
        raise P.ProbeError(f"cannot create the probe directory under {planned.root}: "
                           f"{err.strerror}") from None
    return out_dir


def _remove(out_dir: Path) -> None:
    """A probe directory nothing ran in, and probes/ if that leaves it empty."""
    shutil.rmtree(out_dir, ignore_errors=True)
    try:
        out_dir.parent.rmdir()
    except OSError:
        pass


def torchrun_command(plan: dict, plan_path: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run",
            f"--nproc-per-node={plan['scale']}", "--nnodes=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--max-restarts=0",
            "--monitor-interval=1", "-m", "trainbench.probe.worker", str(plan_path)]


def run_local(plan: dict, out_dir: Path, echo=print) -> tuple[int, str]:
    """torchrun with one worker per rank; every line goes to probe.log, rank 0's progress
    lines (`probe: ...`) also to `echo`. Returns (exit code, reason) and writes exit.json."""
    env = dict(os.environ)
    if plan["device"] == "cpu":
        # The ranks share this machine's cores: each gets its share, as in a CPU run.
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // plan["scale"]))
    env["PYTHONUNBUFFERED"] = "1"
    started = time.time()
    lines: list[str] = []
    errors: dict[int, str] = {}
    interrupted = None
    proc = subprocess.Popen(torchrun_command(plan, out_dir / P.PLAN_FILE), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True,
                            preexec_fn=local.stop_with_parent(os.getpid()))
    try:
        with open(out_dir / LOG_FILE, "a") as log:
            for raw in proc.stdout:
                text = raw.rstrip("\n")
                log.write(raw if raw.endswith("\n") else raw + "\n")
                log.flush()
                if text.startswith("probe: "):
                    echo(text)
                elif m := local._RANK_ERROR.match(text):
                    errors.setdefault(int(m.group(1)), m.group(2))
                lines = (lines + [text])[-400:]
        code = proc.wait()
        if code < 0:
            code = 128 - code
    except KeyboardInterrupt:
        local._kill_group(proc)
        interrupted = signal.SIGINT
        code = 130
    finally:
        if proc.poll() is None:
            local._kill_group(proc)
        local._reap_group(proc)
    if code == 0:
        reason = "completed"
    elif interrupted is not None:
        reason = local.describe_interruption(interrupted)
    else:
        reason = local.describe_failure(code, lines, errors, plan["scale"])
    record = {"exit_code": code, "reason": reason, "executor": "local",
              "elapsed_s": round(time.time() - started, 3), "ended": time.time()}
    try:
        (out_dir / "exit.json").write_text(json.dumps(record, indent=2))
    except OSError:
        pass
    return code, reason


def render_slurm(planned: PlannedProbe, out_dir: Path, opts: SlurmOptions) -> str:
    return render_sbatch(planned.job, out_dir, opts, planned.cluster)


def submit_slurm(planned: PlannedProbe, opts: SlurmOptions) -> tuple[Path, str]:
    """Validate, create the probe directory with its plan and script, sbatch it; a refused
    submission removes the directory again. (probe directory, Slurm job id)."""
    check_options(planned.job, opts, planned.cluster)
    warn_missing_settings(planned.job, opts, planned.cluster)
    out_dir = create_probe_dir(planned)
    try:
        script = render_slurm(planned, out_dir, opts)
        path = out_dir / script_name(planned.plan["name"])
        path.write_text(script)
        job_id = submit(path)
    except (SlurmError, SubmitError, OSError):
        _remove(out_dir)
        raise
    return out_dir, job_id
