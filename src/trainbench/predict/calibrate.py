"""Fit the model's efficiency constants to measured runs of one cluster.

A measured run is an experiment directory holding plan.json and metrics.jsonl (the
engine's StepMetrics lines); its step time is the mean over the seeds' window
(metrics.default_window). The fit minimises the mean squared log ratio of predicted to
measured step time over the runs, plus a weak pull of each constant towards its default
so that constants the runs cannot inform stay where physics put them. Coordinate descent
with a golden-section search per constant, in log space, inside physical bounds.
Pure Python.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from .. import metrics
from ..catalog import hardware, measured
from ..plan import Plan
from ..planning import load_plan
from .constants import CALIBRATION_KEY, Constants, constants_for
from .context import Context, make_context
from .perf import predict_from_context

PLAN_FILE = "plan.json"
METRICS_FILE = "metrics.jsonl"

# Constants a calibration fits, with physical bounds.
BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_eff_bf16": (0.3, 0.95),
    "gemm_eff_fp8": (0.2, 0.95),
    "attn_eff": (0.15, 0.9),
    "hbm_eff": (0.3, 0.95),
    "tp_overlap": (0.0, 0.95),
    "layer_overhead_us": (1.0, 2000.0),
    "gemm_half_dim": (8.0, 4096.0),
    "attn_half_len": (16.0, 8192.0),
}
FIT_FIELDS = tuple(BOUNDS)
REGULARISATION = 0.0005
"""Weight of the pull towards the defaults, per constant, on (log ratio)^2."""


def gpu_bounds(gpu_type: str) -> dict[str, tuple[float, float]]:
    """BOUNDS with each GEMM efficiency capped at the GPU type's measured best large-matmul
    rate over its peak (catalog.measured), where one is known: a training step's GEMMs
    cannot beat the best matmul the GPU was measured to sustain. Without the cap the H100
    fit put FP8 GEMMs at 0.734 of the FP8 peak, above the 0.709 measured (and the 0.679
    `trainbench probe` measured at the seed shapes on one H100, README "On a GPU"), and
    carried that excess to every other GPU type."""
    out = dict(BOUNDS)
    gpu, figures = hardware.GPUS.get(gpu_type.lower()), measured.measured_for(gpu_type)
    if gpu is None or figures is None:
        return out
    for dtype, figure in figures.gemm_tflops.items():
        name, peak = f"gemm_eff_{dtype}", gpu.peak(dtype)
        if name in out and figure.known and peak:
            lo, hi = out[name]
            out[name] = (lo, min(hi, figure.value / peak))
    return out


class CalibrationError(ValueError):
    """Nothing usable to calibrate from; the message says what is missing."""


@dataclass(frozen=True)
class MeasuredRun:
    plan: Plan
    step_time_s: float
    steps_used: int
    source: str


def step_times(metrics_path: Path) -> dict[int, float]:
    """Step time by iteration from a metrics.jsonl (malformed lines are skipped)."""
    out: dict[int, float] = {}
    for line in metrics_path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
            out[int(record["iteration"])] = float(record["step_time_s"])
        except (ValueError, KeyError, TypeError):
            continue
    return out


def total_iterations(metrics_path: Path, times: dict[int, float]) -> int:
    for line in metrics_path.read_text().splitlines():
        try:
            return int(json.loads(line)["total_iterations"])
        except (ValueError, KeyError, TypeError):
            continue
    return max(times) + 1


def read_run(directory: Path) -> MeasuredRun | None:
    """A measured run from one experiment directory; None when it has no usable steps."""
    plan = load_plan(directory / PLAN_FILE)
    mpath = directory / METRICS_FILE
    if not mpath.exists():
        return None
    times = step_times(mpath)
    if not times:
        return None
    window = metrics.default_window(total_iterations(mpath, times))
    stats = metrics.window_stats(times, window)
    if stats is None or stats.mean <= 0:
        return None
    return MeasuredRun(plan, stats.mean, stats.count, str(directory))


def find_runs(root: str | Path) -> tuple[list[MeasuredRun], list[str]]:
    """Every experiment directory under `root` (plan.json beside metrics.jsonl), and one
    line per directory skipped."""
    root = Path(root)
    runs, skipped = [], []
    for plan_path in sorted(root.rglob(PLAN_FILE)):
        try:
            run = read_run(plan_path.parent)
        except (OSError, ValueError, KeyError, TypeError) as err:
            skipped.append(f"{plan_path.parent}: unreadable plan.json ({err})".splitlines()[0])
            continue
        if run is None:
            skipped.append(f"{plan_path.parent}: no step times in {METRICS_FILE}")
            continue
        runs.append(run)
    return runs, skipped


@dataclass(frozen=True)
class FitResult:
    gpu_type: str
    constants: Constants
    fitted: dict[str, float]
    """The constants the fit changed, with their new values."""
    errors_before: list[float]
    """Signed relative errors of step time per run before the fit."""
    errors_after: list[float]
    runs: list[MeasuredRun]

    @staticmethod
    def _mean_abs(errors: list[float]) -> float:
        return 100 * statistics.fmean(abs(e) for e in errors)

    @property
    def mean_abs_before_pct(self) -> float:
        return self._mean_abs(self.errors_before)

    @property
    def mean_abs_after_pct(self) -> float:
        return self._mean_abs(self.errors_after)

    @property
    def max_abs_before_pct(self) -> float:
        return 100 * max(abs(e) for e in self.errors_before)

    @property
    def max_abs_after_pct(self) -> float:
        return 100 * max(abs(e) for e in self.errors_after)


def _errors(contexts: list[Context], runs: list[MeasuredRun], c: Constants) -> list[float]:
    return [predict_from_context(replace(ctx, constants=c)).step_time_s / run.step_time_s - 1
            for ctx, run in zip(contexts, runs)]


def _objective(contexts, runs, c: Constants, base: Constants, names) -> float:
    errs = _errors(contexts, runs, c)
    loss = statistics.fmean(math.log1p(e) ** 2 for e in errs)
    for name in names:
        v, v0 = getattr(c, name), getattr(base, name)
        if v0 > 0 and v > 0:
            loss += REGULARISATION * math.log(v / v0) ** 2
    return loss


def _golden(f, lo: float, hi: float, iterations: int = 24) -> float:
    """Minimum of a unimodal f on [lo, hi] by golden-section search."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iterations):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    return (a + b) / 2


def fit(runs: list[MeasuredRun], gpu_type: str, *, config: dict | None = None,
        names: tuple[str, ...] = FIT_FIELDS, sweeps: int = 4,
        sharding: str = "recipe") -> FitResult:
    """Fit `names` for one GPU type to its runs; CalibrationError when there are none."""
    mine = [r for r in runs if r.plan.gpu_type == gpu_type]
    if not mine:
        raise CalibrationError(f"no measured runs on {gpu_type}")
    base = constants_for(gpu_type, config)
    contexts = [make_context(r.plan, sharding=sharding, config=config, constants=base)
                for r in mine]
    before = _errors(contexts, mine, base)
    bounds = gpu_bounds(gpu_type)
    current = base
    for _ in range(sweeps):
        for name in names:
            lo, hi = bounds[name]
            # Search log space for scale constants; overlap fractions may be zero.
            if lo > 0:
                value = math.exp(_golden(
                    lambda x: _objective(contexts, mine, replace(current, **{name: math.exp(x)}),
                                         base, names), math.log(lo), math.log(hi)))
            else:
                value = _golden(
                    lambda x: _objective(contexts, mine, replace(current, **{name: x}), base,
                                         names), lo, hi)
            candidate = replace(current, **{name: value})
            if (_objective(contexts, mine, candidate, base, names)
                    <= _objective(contexts, mine, current, base, names)):
                current = candidate
    after = _errors(contexts, mine, current)
    fitted = {n: round(getattr(current, n), 6) for n in names
              if not math.isclose(getattr(current, n), getattr(base, n), rel_tol=1e-6)}
    return FitResult(gpu_type, current, fitted, before, after, mine)


def store(config: dict, result: FitResult) -> dict:
    """The config with the fitted constants (and a record of the fit) for the GPU type;
    other keys and other GPU types are left as they were."""
    out = dict(config)
    section = dict(out.get(CALIBRATION_KEY) or {})
    entry = {n: float(v) for n, v in result.fitted.items()}
    previous = section.get(result.gpu_type) or {}
    # Keep earlier calibrated constants this fit did not touch.
    for key, value in previous.items():
        if not key.startswith("_") and key not in entry and key not in result.fitted:
            entry[key] = value
    entry["_runs"] = len(result.runs)
    entry["_mean_abs_error_pct_before"] = round(result.mean_abs_before_pct, 3)
    entry["_mean_abs_error_pct_after"] = round(result.mean_abs_after_pct, 3)
    section[result.gpu_type] = entry
    out[CALIBRATION_KEY] = section
    return out
