"""Each kind of acceptance row, run through the real CLI and read back from what it wrote:
a training run beside predict's figures, a checkpoint saved and resumed, a profiled step,
and a probe of the device. No torch here: the commands import it."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ..probe.profile import (MEMORY_METRIC, SUSTAINED_METRIC, ProbeError, load_profile,
                             rank_metrics)
from ..results.predicted import allocated_peak_gib
from ..results.summary import summarize_experiment
from .rows import BUILD, CHECKPOINT, PROBE, PROFILE, Row
from .runner import Finished, experiment_dir, run_limited, trainbench_command

SUCCESS, FAILED, TIMED_OUT, NOT_RUN = "Success", "Failed", "Timed out", "Not run"


@dataclass
class RowResult:
    label: str
    kind: str
    shape: str = ""
    dtype: str = ""
    status: str = NOT_RUN
    detail: str = ""
    """What the row found, or why it failed, in one line."""
    note: str = ""
    """Why the row runs what it runs (a fallback to the tiny size)."""
    seconds: float = 0.0
    limit_s: float = 0.0
    step_s: float | None = None
    pred_step_s: float | None = None
    mfu_pct: float | None = None
    pred_mfu_pct: float | None = None
    memory_gib: float | None = None
    """The peak predict is compared with: the allocator's peak of allocated bytes where
    the run recorded it (a GPU's), else the peak its log reports."""
    memory_reserved_gib: float | None = None
    """Beside an allocated peak: the peak the allocator reserved (the log's)."""
    pred_memory_gib: float | None = None
    experiment: str | None = None
    log: str = ""

    def to_dict(self) -> dict:
        return {**asdict(self), "seconds": round(self.seconds, 1)}


@dataclass(frozen=True)
class Context:
    out: Path
    """The acceptance run's own directory: runs/<label>/ and logs/<label>.log in it."""
    gpu_key: str
    steps: int


def _paths(ctx: Context, row: Row) -> tuple[Path, Path]:
    root = ctx.out / "runs" / row.label
    root.mkdir(parents=True, exist_ok=True)
    return root, ctx.out / "logs" / f"{row.label}.log"


def _run(ctx: Context, row: Row, root: Path, log: Path, steps: int | None,
         *extra: str) -> Finished:
    args = ["run", "-w", row.workload, "-s", row.size, "--dtype", row.dtype, "--scale", "1",
            "--gpu", ctx.gpu_key, "--root", str(root), *extra]
    if steps is not None:
        args += ["--steps", str(steps)]
    if row.settings:
        args += ["--set", row.settings]
    return run_limited(trainbench_command(*args), log, row.limit_s)


def _ended(res: RowResult, fin: Finished, what: str) -> bool:
    """Record how a command ended; True when it succeeded."""
    res.seconds += fin.seconds
    if fin.timed_out:
        res.status = TIMED_OUT
        res.detail = (f"{what} stopped at its own {res.limit_s:g} s limit; the other rows "
                      "went on")
        return False
    if fin.code != 0:
        res.status = FAILED
        res.detail = f"{what} exited {fin.code}: {_last_error(fin.log)}"
        return False
    return True


def _last_error(log: Path) -> str:
    """The log's last `trainbench: error:` line, else its last line."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    errors = [ln for ln in lines if ln.startswith("trainbench: error:")]
    return (errors or lines or ["no output"])[-1][:300]


def _settle(res: RowResult, exp: Path | None):
    """The row's status from what its run wrote (results' own verdict), and that result."""
    ran = res.status == NOT_RUN  # the command ended well: its records decide
    if exp is None:
        if ran:
            res.status, res.detail = FAILED, "the run left no experiment directory"
        return None
    res.experiment = str(exp)
    r = summarize_experiment(exp)
    if ran:
        res.status = SUCCESS if r.status == "Success" else FAILED
        if res.status == FAILED:
            res.detail = res.detail or f"{r.status}: {r.status_detail or r.last_error or ''}"
    return r


def _measure(res: RowResult, exp: Path | None) -> None:
    """The run's own figures (its window statistics), beside predict's for its plan."""
    r = _settle(res, exp)
    if r is None:
        return
    res.step_s, res.mfu_pct, res.memory_gib = r.step_time_mean_s, r.mfu_pct, r.peak_memory_gib
    allocated = allocated_peak_gib(r.records)
    if allocated is not None:
        # predict counts allocated bytes (its allowance stands for the allocator's
        # caching); the reserved peak stays beside it.
        res.memory_reserved_gib, res.memory_gib = res.memory_gib, allocated
    # results' own figures for the run's plan, with the scan its run.json says ran
    res.pred_step_s, res.pred_mfu_pct = r.predicted_step_time_s, r.predicted_mfu_pct
    res.pred_memory_gib = r.predicted_memory_gib
    if r.mfu_problem:
        res.detail = r.mfu_problem


def train(ctx: Context, row: Row, res: RowResult) -> None:
    root, log = _paths(ctx, row)
    fin = _run(ctx, row, root, log, ctx.steps)
    _ended(res, fin, "the run")
    _measure(res, experiment_dir(root))


_SAVED = re.compile(r"Global Checkpoint Save : .*Iteration: (\d+) .*Save duration: ([\d.]+)s")
_LOADED = re.compile(r"Time spent in load_checkpoint: ([\d.]+)s")


def checkpoint(ctx: Context, row: Row, res: RowResult) -> None:
    """Train, save at the end, then load it in a new run and train one step more."""
    root, log = _paths(ctx, row)
    fin = _run(ctx, row, root / "save", log, max(ctx.steps, 2), "--checkpoint")
    saved = experiment_dir(root / "save")
    if not _ended(res, fin, "the saving run"):
        return
    if saved is None:
        res.status, res.detail = FAILED, "the saving run left no experiment directory"
        return
    fin = _run(ctx, row, root / "resume", log, None, "--load-checkpoint",
               str(saved / "checkpoints"))
    resumed = experiment_dir(root / "resume")
    ok = _ended(res, fin, "the resumed run")
    r = _settle(res, resumed)
    text = log.read_text(errors="replace")
    save, load = _SAVED.findall(text), _LOADED.findall(text)
    if ok and r is not None and save and load:
        last = r.records[-1] if r.records else None
        res.detail = (f"saved at iteration {save[-1][0]} in {float(save[-1][1]):.2f} s, "
                      f"loaded in {float(load[-1]):.2f} s"
                      + (f", then trained iteration {last.iteration} (loss {last.loss:.4f})"
                         if last and last.loss is not None else ""))
    elif ok and res.status == SUCCESS:
        res.status, res.detail = FAILED, "no checkpoint save and load lines in the logs"


def profile(ctx: Context, row: Row, res: RowResult) -> None:
    """A short run whose last step runs under torch.profiler."""
    root, log = _paths(ctx, row)
    steps = max(ctx.steps, 3)
    fin = _run(ctx, row, root, log, steps, "--profile", "torch", "--profile-steps",
               f"{steps - 1}-{steps - 1}")
    ok = _ended(res, fin, "the profiled run")
    exp = experiment_dir(root)
    _settle(res, exp)
    traces = sorted((exp / "profile").rglob("*.json*")) if exp else []
    if ok and res.status == SUCCESS and traces:
        size = sum(t.stat().st_size for t in traces) / 2**20
        res.detail = (f"iteration {steps - 1} profiled: {len(traces)} trace file(s), "
                      f"{size:.1f} MiB, in {traces[0].parent.relative_to(ctx.out)}")
    elif ok and res.status == SUCCESS:
        res.status, res.detail = FAILED, "the profiled run wrote no trace"


def build(ctx: Context, row: Row, res: RowResult) -> None:
    """`trainbench check` of the real-width proxy: its one rank built on the meta device
    under a fake process group, model state against predict's. On a CPU the plan is
    an H100's."""
    root, log = _paths(ctx, row)
    report = root / "check.json"
    fin = run_limited(trainbench_command(
        "check", "-w", row.workload, "-s", row.size, "--dtype", row.dtype, "--scale", "1",
        "--gpu", "h100" if ctx.gpu_key == "cpu" else ctx.gpu_key, "--set", row.settings,
        "--format", "json"), log, row.limit_s, stdout=report)
    if not _ended(res, fin, "check"):
        return
    try:
        rank = json.loads(report.read_text())["ranks"][0]
    except (OSError, ValueError, KeyError, IndexError) as err:
        res.status, res.detail = FAILED, f"check wrote no readable report ({err})"
        return
    if rank.get("error"):
        res.status, res.detail = FAILED, f"rank 0 did not build: {rank['error']}"
        return
    res.status = SUCCESS
    res.detail = (f"built on the meta device under a fake process group: "
                  f"{rank['params_local']:,} parameters; predict's model state "
                  f"{rank['model_state_gap_pct']:+.1f}% from the built one")


def probe(ctx: Context, row: Row, res: RowResult) -> None:
    """`trainbench probe` on this one device: GEMMs, attention, the scan, a copy."""
    root, log = _paths(ctx, row)
    fin = run_limited(trainbench_command("probe", "--scale", "1", "--gpu", ctx.gpu_key,
                                         "--root", str(root)), log, row.limit_s)
    if not _ended(res, fin, "the probe"):
        return
    try:
        (path,) = root.glob("probes/*/hardware-profile.json")
        figures = rank_metrics(load_profile(path)["ranks"][0])
    except (ValueError, ProbeError) as err:
        res.status, res.detail = FAILED, f"no readable hardware profile ({err})"
        return
    res.status, res.experiment = SUCCESS, str(path.parent)
    gemms = ", ".join(f"{k.split()[0]} {v:.4g}" for k, v in figures.items()
                      if k.endswith(" GEMM TFLOPS") and SUSTAINED_METRIC not in k)
    res.detail = (f"best GEMM TFLOPS {gemms}; copy {figures.get(MEMORY_METRIC, 0):,.0f} GB/s"
                  " (read + write)")


RUNNERS = {BUILD: build, CHECKPOINT: checkpoint, PROFILE: profile, PROBE: probe}
