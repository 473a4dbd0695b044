"""Two runs (or two sets of repeats) side by side: is the gap real, and what explains it?

`compare(a, b)` puts each side's metrics next to the other's with the difference in
percent and whether it lies outside the run-to-run noise, then lists the differences in
the conditions the runs recorded (plan.json; run.json's `conditions` and `telemetry`),
most likely cause first. Pure Python: no torch, no scipy.

Noise. One run per side: Welch's t-test (unequal variances) on the step times of the two
timed windows; for tokens/s, TFLOPS and MFU on each step's time per unit of the metric
(per token, per FLOP), so their verdict is the step time's when both sides do the same
work per step. Sets (two or more runs on each side): the same test on the runs' own
figures (throughputs inverted likewise), so the spread is what a repeat would see. A
difference is "outside noise" when the two-sided p-value is below 5%, i.e. when the 95%
confidence interval of the difference excludes zero. p comes from Student's t distribution with Welch's
fractional degrees of freedom, through the regularized incomplete beta function.

Ranking of the condition differences (the order of CATEGORIES, then a fixed order of
keys within each): the plan (layout, batch, sequence, dtype, recompute, compile, FP8
recipe, model overrides, profiling) changes the work itself; environment variables that
choose algorithms, transports or threads (NCCL_ALGO, NCCL_PROTO, OMP_NUM_THREADS ...)
change how it runs; then software versions; then GPUs, clocks, power and throttling;
then topology; then the host (CPU, memory, kernel, hostname); last, environment
variables that only change logging.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table
from rich.text import Text

from ..rundir import PLAN_FILE, RUN_FILE
from .parse import formats_read
from .stats import NoiseTest, welch_test
from .status import SUCCESS, UNRECOGNISED
from .summary import ExperimentResult, summarize_paths

NUMERIC_TOLERANCE = 0.02
"""Measured readings (current clocks, mean power, temperature) differ a little in every
run; a relative difference below this is not listed as a difference in conditions."""
METHOD_STEPS = ("Welch's t-test on the step times of the two timed windows (throughputs: "
                "on each step's time per token, per FLOP), two-sided, 5% level: outside "
                "noise when the 95% CI of the difference excludes 0")
METHOD_RUNS = ("Welch's t-test on the runs' figures, one per run (throughputs: as time "
               "per token, per FLOP), two-sided, 5% level: outside noise when the 95% CI "
               "of the difference excludes 0")


# --- the sides -------------------------------------------------------------------------------

@dataclass
class Side:
    """One side of a comparison: a run, or a set of repeats of one plan."""

    label: str
    paths: list[str]
    results: list[ExperimentResult]
    infos: list[dict]
    """Per run (run_info): plan.json, run.json and each node's conditions-<host>.json."""


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # summarize_experiment already notes an unreadable file
    return data if isinstance(data, dict) else None


def run_info(result: ExperimentResult) -> dict:
    """plan.json and run.json of a trainbench run (None for another framework's log)."""
    path = Path(result.path)
    if not path.is_dir():
        return {"plan": None, "run": None, "result": result}
    # Each node's own record (local rank 0 writes conditions-<host>.json): run.json has
    # rank 0's node only, and a slow node elsewhere is what explains many gaps.
    nodes = [data for f in sorted(path.glob("conditions-*.json"))
             if (data := _read_json(f)) is not None]
    return {"plan": _read_json(path / PLAN_FILE), "run": _read_json(path / RUN_FILE),
            "nodes": nodes, "result": result}


def load_side(label: str, paths: list[str | Path], **options) -> Side:
    """Every experiment under the paths (see summarize_paths) as one side.
    FileNotFoundError for a missing path; ValueError when a path holds no experiment."""
    results: list[ExperimentResult] = []
    for path in paths:
        found = summarize_paths([path], **options)
        if not found:
            raise ValueError(f"{path} is not an experiment: no plan.json or metrics.jsonl, "
                             "and no log with step lines under it")
        if all(r.status == UNRECOGNISED for r in found):
            raise ValueError(f"{path} is not an experiment: no line in a format trainbench "
                             f"reads ({formats_read()})")
        results.extend(found)
    return Side(label, [str(p) for p in paths], results, [run_info(r) for r in results])


# --- metrics side by side ------------------------------------------------------------------

@dataclass
class MetricRow:
    name: str
    unit: str
    a: float | None
    b: float | None
    a_text: str
    b_text: str
    diff_pct: float | None
    test: NoiseTest | None
    note: str = ""

    def to_dict(self) -> dict:
        return {"metric": self.name, "unit": self.unit, "a": self.a, "b": self.b,
                "a_text": self.a_text, "b_text": self.b_text, "diff_pct": self.diff_pct,
                "noise": self.test.to_dict() if self.test else None, "note": self.note}


def _window_times(r: ExperimentResult) -> dict[int, float]:
    if r.window is None:
        return {}
    first, last = r.window
    return {rec.iteration: rec.step_time_s for rec in r.records
            if first <= rec.iteration <= last and rec.step_time_s is not None
            and math.isfinite(rec.step_time_s) and rec.step_time_s > 0}


def _per_step(r: ExperimentResult, attr: str) -> list[float]:
    """What the noise test compares for one run: each window step's time, scaled for a
    throughput metric to the time per unit of it (value = K / mean step time for a
    constant K of the run, so step i takes t_i / K per unit). The t statistic does not
    change when both sides are scaled alike, so tokens/s, TFLOPS and MFU get the step
    time's verdict when the work per step is the same, and a per-token verdict when it
    is not; a step's reciprocal would weigh slow steps differently from the step time's
    test and could disagree with it."""
    times = list(_window_times(r).values())
    if attr == "step_time_mean_s":
        return times
    value = getattr(r, attr)
    if not value or r.step_time_mean_s is None:
        return []
    k = value * r.step_time_mean_s
    return [t / k for t in times]


def _metric_value(r: ExperimentResult, attr: str) -> float | None:
    if attr == "mfu_pct" and r.mfu_problem:
        return None
    value = getattr(r, attr)
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


# (attribute, label, unit, format, whether per-step values exist)
METRICS = (
    ("step_time_mean_s", "step time", "s", ".4g", True),
    ("tokens_per_s", "tokens/s", "", ",.1f", True),
    ("tokens_per_s_per_gpu", "tokens/s per GPU", "", ",.1f", True),
    ("tflops_per_gpu", "TFLOPS/GPU", "", ".4g", True),
    ("mfu_pct", "MFU", "%", ".2f", True),
    ("peak_memory_gib", "peak memory", "GiB", ".3f", False),
    ("energy_per_token_j", "energy per token", "J", ".4g", False),
)


def _side_text(side: Side, attr: str, fmt: str, values: list[float]) -> str:
    if attr == "mfu_pct" and any(r.mfu_problem for r in side.results):
        return "INVALID"
    if not values:
        return "-"
    if len(side.results) == 1:
        r = side.results[0]
        text = format(values[0], fmt)
        if attr == "step_time_mean_s" and r.step_time_std_s is not None:
            text += f" ± {format(r.step_time_std_s, fmt)} ({r.window_count} steps " \
                    f"{r.window_start}-{r.window_end})"
        return text
    text = format(statistics.fmean(values), fmt)
    if len(values) > 1:
        text += f" ± {format(statistics.stdev(values), fmt)}"
    return text + f" ({len(values)} runs)"


def metric_rows(a: Side, b: Side) -> tuple[list[MetricRow], str]:
    """The metric rows and the noise method used (per-step values, or runs' figures)."""
    sets = len(a.results) >= 2 and len(b.results) >= 2
    rows = []
    for attr, label, unit, fmt, per_step in METRICS:
        va = [v for r in a.results if (v := _metric_value(r, attr)) is not None]
        vb = [v for r in b.results if (v := _metric_value(r, attr)) is not None]
        if attr == "energy_per_token_j" and not (va or vb):
            continue  # no side measured energy: no row
        mean_a = statistics.fmean(va) if va else None
        mean_b = statistics.fmean(vb) if vb else None
        diff = 100.0 * (mean_b / mean_a - 1.0) if mean_a and mean_b is not None else None
        note = ""
        if attr == "mfu_pct" and any(r.mfu_problem for r in a.results + b.results):
            diff, test = None, None
            note = "an MFU is INVALID (its peak is wrong): not compared"
        elif va and vb and sets:
            # Throughputs as time per unit, for the reason _per_step gives.
            inverse = per_step and attr != "step_time_mean_s"
            test = welch_test(*([1 / v for v in vs if v] if inverse else vs
                                for vs in (va, vb)))
        elif va and vb and per_step:
            # One run on a side (or one run against a set): the windows' steps, pooled
            # per side, stand for the noise.
            test = welch_test([x for r in a.results for x in _per_step(r, attr)],
                              [x for r in b.results for x in _per_step(r, attr)])
        elif va and vb:
            test = None
            note = "one value per run: no noise estimate (repeat the runs)"
        else:
            test = None
        rows.append(MetricRow(label, unit, mean_a, mean_b, _side_text(a, attr, fmt, va),
                              _side_text(b, attr, fmt, vb), diff, test, note))
    return rows, METHOD_RUNS if sets else METHOD_STEPS


# --- conditions ------------------------------------------------------------------------------

CATEGORIES = ("plan", "environment", "versions", "GPUs, clocks, power", "topology", "host",
              "environment (logging)")

_PLAN_KEYS = ("workload", "size", "dtype", "gpu_type", "gpus", "num_nodes", "gpus_per_node",
              "layout.tp", "layout.pp", "layout.cp", "layout.dp", "layout.vp", "layout.ep",
              "layout.dp_shard", "mbs", "gbs", "ga", "seq_len", "recompute", "compile",
              "fp8_recipe", "features.profile", "features.nccl_trace", "peak_tflops",
              "steps", "features.load_checkpoint", "lr", "min_lr", "warmup_steps", "seed")
_PLAN_NOT_COMPARED = ("name", "out_dir", "env", "recipe_note", "recipe_source", "model",
                      "layout", "features")
"""Where a run was written, its recipe's wording, and what is compared key by key
(the environment with the conditions' own, model, layout and features field by field)."""
_VERSION_KEYS = ("torch", "cuda", "nccl", "cudnn", "driver", "torchao", "trainbench", "python")
_GPU_KEYS = ("count", "name", "memory_bytes", "sm_clock_max_mhz", "mem_clock_max_mhz",
             "power_limit_w", "ecc", "mig", "persistence", "sm_clock_mhz", "mem_clock_mhz")
_MEASURED = ("gpu.sm_clock_mhz", "gpu.mem_clock_mhz", "telemetry.sm_clock_mhz.mean",
             "telemetry.power_w.mean", "telemetry.temperature_c.max",
             "telemetry.cpu_clock_mhz.mean")
_HOST_KEYS = ("cpu.threads_per_rank", "cpu.model", "cpu.cores", "cpu.flags", "memory_bytes",
              "host.kernel", "host.os", "slurm.partition", "slurm.cluster", "slurm.nodelist",
              "host.hostname")
# Environment variables that choose an algorithm, a transport, channels or threads, and
# so change speed; NCCL_DEBUG and the like only change what is logged.
_PERF_ENV = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS",
             "NCCL_MIN_CTAS", "NCCL_MAX_CTAS", "NCCL_NTHREADS", "NCCL_BUFFSIZE",
             "NCCL_NVLS_ENABLE", "NCCL_COLLNET_ENABLE", "NCCL_CROSS_NIC", "NCCL_NET",
             "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ", "NCCL_P2P_LEVEL", "NCCL_P2P_DISABLE",
             "NCCL_SHM_DISABLE", "NCCL_IB_", "NCCL_SOCKET_", "NCCL_NSOCKS_PERTHREAD",
             "NCCL_CUMEM_ENABLE", "NCCL_GRAPH_", "NCCL_TOPO_",
             "NCCL_PXN_DISABLE", "NCCL_LL128_", "NCCL_CTA_POLICY", "CUDA_DEVICE_MAX_CONNECTIONS",
             "CUDA_LAUNCH_BLOCKING", "CUDA_VISIBLE_DEVICES", "CUDA_MODULE_LOADING",
             "OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "TORCH_NCCL_AVOID_RECORD_STREAMS",
             "TORCH_NCCL_HIGH_PRIORITY", "TORCH_COMPILE", "TORCHINDUCTOR_", "NVTE_",
             "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def is_performance_env(name: str) -> bool:
    """Whether a variable chooses an algorithm, transport, channels or threads."""
    return any(name == p or (p.endswith("_") and name.startswith(p)) for p in _PERF_ENV)


def _get(data, dotted: str):
    for part in dotted.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def _gpu_summary(gpus: list, key: str):
    """One value for the node's GPUs: the common value, or each value with its count."""
    if not isinstance(gpus, list) or not gpus:
        return None
    if key == "count":
        return len(gpus)
    if key in ("sm_clock_mhz", "mem_clock_mhz"):
        # Current clocks are readings that differ a little per GPU: their mean is compared
        # with a tolerance (NUMERIC_TOLERANCE).
        readings = [g.get(key) for g in gpus if isinstance(g, dict)]
        if readings and all(isinstance(x, (int, float)) for x in readings):
            return statistics.fmean(readings)
    values = [g.get(key) for g in gpus if isinstance(g, dict)]
    if len(set(map(repr, values))) == 1:
        return values[0]
    counts = Counter(map(str, values))
    return ", ".join(f"{v} (x{n})" for v, n in counts.items())


def _condition_values(info: dict, with_conditions: bool, with_telemetry: bool
                      ) -> dict[str, tuple[int, int, object]]:
    """key -> (category rank, order within the category, value) for one run."""
    plan, run = info.get("plan"), info.get("run") or {}
    values: dict[str, tuple[int, int, object]] = {}
    if plan is not None:
        order = {k: i for i, k in enumerate(_PLAN_KEYS)}
        flat = {k: _get(plan, k) for k in _PLAN_KEYS}
        for k, v in plan.items():  # a plan field this list does not know yet still counts
            if k not in flat and k not in _PLAN_NOT_COMPARED and not isinstance(v, (dict, list)):
                flat[k] = v
        for k, v in (plan.get("model") or {}).items():  # model overrides (--set layers=...)
            flat[f"model.{k}"] = v
        for k, v in flat.items():
            if k.startswith("features.") and not v:
                v = None  # off: shown as '-', the same whether absent, '' or False
            if k == "features.load_checkpoint" and v:
                v = "yes"
            values[k] = (0, order.get(k, len(order)), v)
        if plan.get("features", {}).get("profile"):
            f = plan["features"]
            values["features.profile_steps"] = (0, order["features.profile"],
                                                f"{f.get('profile_start')}-{f.get('profile_stop')}")
    else:
        # Another framework's log: what summarize_experiment identified.
        r = info.get("result")
        if r is not None:
            for i, k in enumerate(("workload", "size", "dtype", "gpu_type", "gpus", "layout",
                                   "gbs", "seq_len")):
                if getattr(r, k) is not None:  # unknown is not a difference
                    values[k] = (0, i, getattr(r, k))
    env = {k: v for k, v in (plan or {}).get("env", ()) or ()}
    cond = run.get("conditions") if isinstance(run.get("conditions"), dict) else None
    if with_conditions and cond is not None:
        env = {**(cond.get("env") or {}), **env}
        nodes = [n for n in info.get("nodes") or [] if isinstance(n, dict)] or [cond]
        gpus = [g for n in nodes for g in (n.get("gpus") or [])]

        def across(get):
            """One value for all nodes, or each value with its count of nodes."""
            found = [get(n) for n in nodes]
            found = [" ".join(v) if isinstance(v, list) else v for v in found]
            if len(set(map(repr, found))) == 1:
                return found[0]
            return ", ".join(f"{v} (x{n})" for v, n in Counter(map(str, found)).items())
        for i, k in enumerate(_VERSION_KEYS):
            value = (_gpu_summary(gpus, "driver") if k == "driver"
                     else across(lambda n, k=k: n.get(k)))
            values[f"version.{k}"] = (2, i, value)
        for i, k in enumerate(_GPU_KEYS):
            values[f"gpu.{k}"] = (3, i, _gpu_summary(gpus, k))
        values["topology"] = (4, 0, across(lambda n: n.get("topology")))
        for i, k in enumerate(_HOST_KEYS):
            values[k] = (5, i, across(lambda n, k=k: _get(n, k)))
    telemetry = run.get("telemetry") if isinstance(run.get("telemetry"), dict) else None
    if with_telemetry and telemetry is not None:
        base = len(_GPU_KEYS)
        reasons = telemetry.get("throttle_reasons") or []
        for i, (k, v) in enumerate((
                ("telemetry.throttled", telemetry.get("throttled")),
                ("telemetry.throttle_reasons", ", ".join(reasons) if reasons else None),
                ("telemetry.sm_clock_mhz.mean", _get(telemetry, "sm_clock_mhz.mean")),
                ("telemetry.power_w.mean", _get(telemetry, "power_w.mean")),
                ("telemetry.temperature_c.max", _get(telemetry, "temperature_c.max")),
                ("telemetry.cpu_clock_mhz.mean", _get(telemetry, "cpu_clock_mhz.mean")))):
            # Throttling explains a gap before any static setting of the GPUs does.
            values[k] = (3, i - base if k.startswith("telemetry.thr") else base + i, v)
    for name in sorted(env):
        values[f"env.{name}"] = (1 if is_performance_env(name) else 6, 0, env[name])
    return values


@dataclass
class Difference:
    category: str
    key: str
    a: object
    b: object
    change: str
    """'changed', 'added' (set on B only), 'removed' (set on A only)."""
    rank: int = 0

    def to_dict(self) -> dict:
        return {"rank": self.rank, "category": self.category, "key": self.key,
                "a": self.a, "b": self.b, "change": self.change}


_MIXED = object()


def _side_value(values: list):
    """A side's value: the one its runs share, or a 'mixed' description."""
    distinct = {json.dumps(v, sort_keys=True, default=str) for v in values}
    if len(distinct) == 1:
        return values[0]
    counts = Counter(json.dumps(v, sort_keys=True, default=str) for v in values)
    return _MIXED, "mixed: " + ", ".join(
        f"{_value_text(json.loads(v))} ({n} run{'s' if n > 1 else ''})"
        for v, n in counts.items())


def _differ(key: str, a, b) -> bool:
    if key in _MEASURED and isinstance(a, (int, float)) and isinstance(b, (int, float)):
        scale = max(abs(a), abs(b))
        return scale > 0 and abs(a - b) / scale > NUMERIC_TOLERANCE
    return json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True,
                                                                   default=str)


def condition_differences(a_infos: list[dict], b_infos: list[dict]
                          ) -> tuple[list[Difference], list[str]]:
    """The differences in conditions between two sides (lists of {"plan", "run"} dicts,
    as run_info gives them), most likely cause first, and notes on what could not be
    compared."""
    notes = []
    everyone = a_infos + b_infos
    with_conditions = all(isinstance((i.get("run") or {}).get("conditions"), dict)
                          for i in everyone)
    if not with_conditions:
        notes.append("conditions not recorded for every run (a log of another framework, or "
                     "a run from before trainbench recorded them): versions, GPUs, host and "
                     "environment beyond --env not compared")
    with_telemetry = all(isinstance((i.get("run") or {}).get("telemetry"), dict)
                         for i in everyone)
    per_run = [[_condition_values(i, with_conditions, with_telemetry) for i in infos]
               for infos in (a_infos, b_infos)]
    keys: dict[str, tuple[int, int]] = {}
    for runs in per_run:
        for values in runs:
            for k, (cat, order, _) in values.items():
                keys.setdefault(k, (cat, order))
    diffs = []
    for key, (cat, order) in keys.items():
        if not key.startswith("env.") and not all(any(key in v for v in runs)
                                                  for runs in per_run):
            continue  # not recorded on one side: unknown there, not different
        sides = []
        for label, runs in zip("AB", per_run):
            raw = [v[key][2] if key in v else None for v in runs]
            if key in _MEASURED and raw and all(isinstance(x, (int, float)) for x in raw):
                value = statistics.fmean(raw)  # a reading: its repeats vary a little
            else:
                value = _side_value(raw)
            if isinstance(value, tuple) and value and value[0] is _MIXED:
                notes.append(f"{label}'s runs differ in {key} ({value[1]})"
                             + (": not repeats of one plan" if cat == 0 else ""))
                value = value[1]
            sides.append(value)
        a, b = sides
        if not _differ(key, a, b):
            continue
        is_env = key.startswith("env.")
        change = ("added" if is_env and a is None else "removed" if is_env and b is None
                  else "changed")
        diffs.append((cat, order, key, Difference(CATEGORIES[cat], key, a, b, change)))
    diffs.sort(key=lambda d: (d[0], d[1], d[2]))
    ranked = [d[3] for d in diffs]
    for i, d in enumerate(ranked, 1):
        d.rank = i
    return ranked, notes


# --- the comparison --------------------------------------------------------------------------

@dataclass
class Comparison:
    a: Side
    b: Side
    metrics: list[MetricRow]
    method: str
    differences: list[Difference]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        def side(s: Side) -> dict:
            return {"paths": s.paths, "runs": [{"name": r.name, "path": r.path,
                                                "status": r.status, "window": r.window,
                                                "comparable": r.comparable}
                                               for r in s.results]}
        return {"a": side(self.a), "b": side(self.b),
                "metrics": [m.to_dict() for m in self.metrics],
                "noise_method": self.method,
                "differences": [d.to_dict() for d in self.differences],
                "ranking": list(CATEGORIES), "notes": self.notes}


def compare(a: Side, b: Side) -> Comparison:
    rows, method = metric_rows(a, b)
    diffs, notes = condition_differences(a.infos, b.infos)
    for side in (a, b):
        if len(side.results) > 1 and len(a.results if side is b else b.results) == 1:
            notes.append(f"{side.label} is a set and the other side one run: the noise test "
                         f"pools {side.label}'s window steps (repeat the other run for a test "
                         "on runs' figures)")
        for r in side.results:
            if r.status != SUCCESS:
                notes.append(f"{side.label}: {r.name} is {r.status}"
                             + (f" ({r.status_detail})" if r.status_detail else ""))
            if not r.comparable:
                notes.append(f"{side.label}: {r.name} was profiled or traced: its timings "
                             "include that overhead"
                             + (f" (profiling overhead {r.profiling_overhead})"
                                if r.profiling_overhead else ""))
            if r.throttled:
                notes.append(f"{side.label}: {r.name} throttled in its timed window: its "
                             "timings reflect lowered clocks")
    peaks = {(r.peak_tflops, r.peak_source) for r in a.results + b.results
             if r.peak_tflops is not None}
    if len(peaks) > 1:
        notes.append("the MFUs use different peaks ("
                     + ", ".join(f"{p:.4g} TFLOPS {s}" for p, s in sorted(peaks, key=str))
                     + "): the MFU gap also holds the peaks' difference")
    return Comparison(a, b, rows, method, diffs, notes)


# --- output ----------------------------------------------------------------------------------

def _value_text(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def difference_line(d: Difference) -> str:
    if d.change == "added":
        what = f"unset (A) -> {_value_text(d.b)} (B)"
    elif d.change == "removed":
        what = f"{_value_text(d.a)} (A) -> unset (B)"
    else:
        what = f"{_value_text(d.a)} (A) -> {_value_text(d.b)} (B)"
    key = d.key[len("env."):] if d.key.startswith("env.") else d.key
    return f"{d.rank:>3}. [{d.category}] {key}: {what}"


def _noise_text(row: MetricRow) -> str:
    t = row.test
    if t is None:
        return row.note or "-"
    if t.outside_noise is None:
        return f"unknown: {t.reason}"
    verdict = "OUTSIDE noise" if t.outside_noise else "within noise"
    return f"{verdict} (p={t.p:.3g})" if t.p is not None else verdict


def _diff_text(row: MetricRow) -> str:
    return "-" if row.diff_pct is None else f"{row.diff_pct:+.1f}%"


def side_line(side: Side) -> str:
    runs = ", ".join(f"{r.name} ({r.status})" for r in side.results)
    return f"{side.label}: {len(side.results)} run(s): {runs}"


def print_comparison(c: Comparison, console) -> None:
    console.print(side_line(c.a), markup=False, highlight=False)
    console.print(side_line(c.b), markup=False, highlight=False)
    table = Table(title="trainbench compare: B against A")
    for header in ("metric", "A", "B", "B vs A", "noise"):
        table.add_column(header, no_wrap=header != "metric")
    for row in c.metrics:
        label = row.name + (f" ({row.unit})" if row.unit else "")
        table.add_row(*(Text(x) for x in (label, row.a_text, row.b_text, _diff_text(row),
                                           _noise_text(row))))
    console.print(table)
    console.print(f"noise: {c.method}", markup=False, highlight=False)
    if c.differences:
        console.print("Differences in conditions, most likely cause first (plan > environment "
                      "that changes algorithms or threads > versions > GPUs, clocks, power > "
                      "topology > host > logging environment):", markup=False, highlight=False)
        for d in c.differences:
            console.print(difference_line(d), markup=False, highlight=False)
    else:
        console.print("No difference in the conditions both sides recorded.", markup=False,
                      highlight=False)
    for note in c.notes:
        console.print(f"note: {note}", markup=False, highlight=False)


def to_json(c: Comparison) -> str:
    def safe(obj):
        if isinstance(obj, float) and not math.isfinite(obj):
            return str(obj)
        if isinstance(obj, dict):
            return {k: safe(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [safe(v) for v in obj]
        return obj
    return json.dumps(safe(c.to_dict()), indent=2, default=str)
