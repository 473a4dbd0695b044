"""Repeats of the same plan: n runs, mean, sample spread and a 95% confidence interval of
step time and tokens/s, and a verdict against the published reference that is given only
when the whole interval supports it. Pure Python (no scipy, no torch).

A run's own figure is the mean step time of its window; the repeats' statistics are over
those per-run means, so the interval says how much the *run* varies, which is what a
second run of the same plan would see (the per-step spread inside one run does not).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..catalog import references
from ..rundir import PLAN_FILE
from .stats import Interval, interval
from .status import SUCCESS
from .summary import DEFAULT_TOLERANCE_PCT, ExperimentResult, speed_verdict

INCONCLUSIVE = "inconclusive, run more repeats"

# Plan fields that differ between repeats of the same plan or do not change what is run:
# where it was written, the environment (a condition of the machine, which `compare`
# names), profiling/checkpoint features (profiled runs are left out of the timings anyway)
# and a user-given MFU peak.
_NOT_PLAN = ("out_dir", "name", "env", "features", "peak_tflops", "recipe_note",
             "recipe_source")


# --- which runs are repeats of one plan ---------------------------------------------------------

def _read_plan(result: ExperimentResult) -> dict | None:
    path = Path(result.path)
    if not path.is_dir() or not (path / PLAN_FILE).is_file():
        return None
    try:
        data = json.loads((path / PLAN_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def plan_key(result: ExperimentResult) -> dict:
    """What makes two runs repeats of one plan, as a JSON-able dict.

    A trainbench run: its plan.json (workload, size, dtype, GPUs, layout, MBS/GBS/seq,
    steps, every --set override) less the fields in _NOT_PLAN, with the GPU type actually
    used. A foreign log: the identity `results` inferred for it; a log whose workload is
    unknown is a plan of its own (nothing says another log ran the same thing).
    """
    plan = _read_plan(result)
    if plan is not None:
        key = {k: v for k, v in plan.items() if k not in _NOT_PLAN}
        key["gpu_type"] = result.gpu_type
        return {"source": "plan.json", **key}
    key = {"source": "inferred", "workload": result.workload, "size": result.size,
           "dtype": result.dtype, "gpu_type": result.gpu_type, "gpus": result.gpus,
           "layout": result.layout, "gbs": result.gbs, "seq_len": result.seq_len,
           "total_iterations": result.total_iterations}
    if not result.workload:
        key["path"] = result.path
    return key


def key_id(key: dict) -> str:
    """A short, stable name of a plan key (the same on every machine)."""
    text = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def plan_label(key: dict) -> str:
    """A readable name of a plan; the id tells apart plans that differ elsewhere."""
    parts = [str(key.get("workload") or "?").replace("pretrain_", ""),
             str(key.get("size") or "?"), str(key.get("dtype") or "?"),
             f"{key.get('gpus') or '?'}x{key.get('gpu_type') or '?'}"]
    layout = key.get("layout")
    if isinstance(layout, dict):
        parts.append("TP{tp} PP{pp} CP{cp} DP{dp}".format(**{k: layout.get(k, "?") for k in
                                                          ("tp", "pp", "cp", "dp")}))
    elif layout:
        parts.append(str(layout))
    for name, short in (("mbs", "MBS"), ("gbs", "GBS"), ("seq_len", "seq"), ("steps", "steps")):
        if key.get(name):
            parts.append(f"{short}{key[name]}")
    return " ".join(parts) + f" #{key_id(key)}"


# --- a group of repeats ------------------------------------------------------------------------

@dataclass
class RepeatGroup:
    key: dict
    results: list[ExperimentResult] = field(default_factory=list)
    used: list[ExperimentResult] = field(default_factory=list)
    """The runs whose timings count: succeeded, comparable, with steps in the window."""
    step_time: Interval | None = None
    tokens_per_s: Interval | None = None
    ref_step_time_s: float | None = None
    ref_tokens_per_s: float | None = None
    verdict: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return key_id(self.key)

    @property
    def label(self) -> str:
        return plan_label(self.key)

    def to_dict(self) -> dict:
        return {"plan": self.id, "label": self.label, "runs": len(self.results),
                "runs_used": len(self.used),
                "step_time_s": self.step_time.to_dict() if self.step_time else None,
                "tokens_per_s": self.tokens_per_s.to_dict() if self.tokens_per_s else None,
                "ref_step_time_s": self.ref_step_time_s,
                "ref_tokens_per_s": self.ref_tokens_per_s, "verdict": self.verdict,
                "notes": list(self.notes), "experiments": [r.path for r in self.results],
                "key": self.key}


def counts(result: ExperimentResult) -> bool:
    """Whether a run's timing enters its plan's statistics."""
    return (result.status == SUCCESS and result.comparable
            and result.step_time_mean_s is not None)


def group_results(results: list[ExperimentResult],
                  tolerance_pct: float = DEFAULT_TOLERANCE_PCT) -> list[RepeatGroup]:
    """The runs grouped by plan, in the order their first run appears, with statistics and
    a verdict each."""
    groups: dict[str, RepeatGroup] = {}
    for r in results:
        key = plan_key(r)
        group = groups.setdefault(key_id(key), RepeatGroup(key))
        group.results.append(r)
    for group in groups.values():
        _finish(group, tolerance_pct)
    return list(groups.values())


def _finish(group: RepeatGroup, tolerance_pct: float) -> None:
    group.used = [r for r in group.results if counts(r)]
    left_out = len(group.results) - len(group.used)
    if left_out:
        group.notes.append(f"{left_out} of {len(group.results)} run(s) left out (not a "
                           "comparable success with steps in the window)")
    group.step_time = interval([r.step_time_mean_s for r in group.used])
    group.tokens_per_s = interval([r.tokens_per_s for r in group.used])
    first = group.results[0]
    group.ref_step_time_s, group.ref_tokens_per_s = first.ref_step_time_s, first.ref_tokens_per_s
    if any(r.throttled for r in group.used):
        group.notes.append("a run throttled during its window")
    group.verdict = group_verdict(group, tolerance_pct)


def _ratio_range(ref: float, iv: Interval, per_token: bool) -> tuple[float, float] | None:
    """The interval as a range of 'our time per token / the reference's'."""
    if iv.low is None or iv.low <= 0:
        return None
    if per_token:  # tokens/s: a higher throughput is a lower ratio
        return ref / iv.high, ref / iv.low
    return iv.low / ref, iv.high / ref


def interval_verdict(ratio_low: float, ratio_high: float, ratio_mean: float,
                     tolerance_pct: float = DEFAULT_TOLERANCE_PCT) -> str:
    """speed_verdict when the whole range of time ratios gives the same answer, else
    inconclusive (the interval straddles a tolerance edge)."""
    tol = tolerance_pct / 100
    if 1 - tol <= ratio_low and ratio_high <= 1 + tol:
        return f"within {tolerance_pct:g}%"
    if ratio_low > 1 + tol or ratio_high < 1 - tol:
        return speed_verdict(ratio_mean, tolerance_pct)
    return INCONCLUSIVE


def group_verdict(group: RepeatGroup, tolerance_pct: float = DEFAULT_TOLERANCE_PCT) -> str:
    """The repeats' verdict against the published reference.

    One run: that run's own verdict (its window's per-step mean) with "(1 run)": one run
    cannot show the run-to-run spread, and the label says so. Two or more: the verdict
    only when the whole 95% interval of the mean (tokens/s where known, else step time)
    supports it, else INCONCLUSIVE.
    """
    if not group.used:
        verdicts = sorted({r.verdict for r in group.results if r.verdict})
        return ("no comparable run" + (f" ({', '.join(verdicts)})" if verdicts else ""))
    throttled = "throttled: " if any(r.throttled for r in group.used) else ""
    if len(group.used) == 1:
        own = group.used[0].verdict
        if own.startswith("throttled: "):
            own = own[len("throttled: "):]
        return f"{throttled}{own} (1 run)"
    if group.ref_tokens_per_s and group.tokens_per_s:
        iv, ref, per_token = group.tokens_per_s, group.ref_tokens_per_s, True
        mean_ratio = ref / iv.mean
    elif group.ref_step_time_s and group.step_time:
        iv, ref, per_token = group.step_time, group.ref_step_time_s, False
        mean_ratio = iv.mean / ref
    else:
        return f"{throttled}no reference"
    span = _ratio_range(ref, iv, per_token)
    if span is None:
        return f"{throttled}{INCONCLUSIVE}"
    return throttled + interval_verdict(span[0], span[1], mean_ratio, tolerance_pct)


def reference_for(key: dict):
    """The published reference of a plan key, or None."""
    try:
        return references.find_reference(key.get("workload"), key.get("size"), key.get("dtype"),
                                         key.get("gpus"), key.get("gpu_type"))
    except (LookupError, TypeError):
        return None


# --- output --------------------------------------------------------------------------------------

def _fmt_iv(iv: Interval | None, fmt: str) -> str:
    if iv is None:
        return "-"
    if iv.low is None:
        return format(iv.mean, fmt)
    return f"{format(iv.mean, fmt)} [{format(iv.low, fmt)}, {format(iv.high, fmt)}]"


def group_lines(groups: list[RepeatGroup]) -> list[str]:
    """The repeats section under the results table: one line per plan."""
    lines = ["repeats (per plan: n runs used, mean [95% CI, Student t] of the runs' window "
             "means):"]
    for g in groups:
        sd = f", sd {g.step_time.std:.3g}" if g.step_time and g.step_time.std is not None else ""
        lines.append(f"  {g.label}: n={len(g.used)}/{len(g.results)}, step s "
                     f"{_fmt_iv(g.step_time, '.4g')}{sd}, tokens/s "
                     f"{_fmt_iv(g.tokens_per_s, ',.0f')}: {g.verdict}"
                     + (f" ({'; '.join(g.notes)})" if g.notes else ""))
    return lines


CSV_COLUMNS = ("plan", "plan_label", "plan_runs", "plan_runs_used", "plan_step_time_mean_s",
               "plan_step_time_std_s", "plan_step_time_ci95_low_s", "plan_step_time_ci95_high_s",
               "plan_tokens_per_s_mean", "plan_tokens_per_s_std", "plan_tokens_per_s_ci95_low",
               "plan_tokens_per_s_ci95_high", "plan_verdict")


def csv_columns(group: RepeatGroup) -> dict:
    """The plan's figures as extra CSV columns of each of its runs' rows."""
    st, tk = group.step_time, group.tokens_per_s
    values = (group.id, group.label, len(group.results), len(group.used),
              st and st.mean, st and st.std, st and st.low, st and st.high,
              tk and tk.mean, tk and tk.std, tk and tk.low, tk and tk.high, group.verdict)
    return dict(zip(CSV_COLUMNS, values))
