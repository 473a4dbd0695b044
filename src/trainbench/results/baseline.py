"""Baselines and regression verdicts: `trainbench results DIR... --baseline B` and
`--reference`, a PASS/FAIL per plan and an exit code that can gate a CI or an acceptance
test. Pure Python, no torch.

Rules (the README's "Repeats and baselines" says the same):
- PASS against a baseline when the plan's mean step time is at most `tolerance` % slower
  than the baseline's (faster passes, with a note) AND its loss curve correlates with the
  baseline's at >= 0.95 (Pearson) over the iterations both logged.
  The whole logged curve is compared, not only the timing window: trainbench's synthetic
  data and seeded init make the loss deterministic from iteration 0, and the window only
  leaves out the warm-up's *timings*; a short run (3 steps: a 2-step window) would
  otherwise have too few points. Fewer than 3 common iterations: FAIL, the correlation
  cannot be computed.
- A plan in the runs with no baseline ("no baseline") and a plan of the baseline with no
  run ("missing") both FAIL: an acceptance gate must cover what its baseline covers, and
  a new plan has nothing to pass against yet (save a new baseline to add it).
- A plan with a failed, invalid or incomplete run FAILs (a gate must not pass a cluster
  that crashes one run in three); profiled runs are left out of the timings, not failed.
- `--reference`: PASS when the plan's mean tokens/s is at least (100 - tolerance) % of the
  published reference's; a plan without a published reference is "no reference", which
  is not a pass.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import metrics, version as package_version
from ..errors import InputError
from ..rundir import RUN_FILE
from .repeats import (RepeatGroup, csv_columns, group_lines, group_results, key_id, plan_label,
                      reference_for)
from .status import FAILED, INCOMPLETE, INVALID
from .summary import summarize_paths

FORMAT = "trainbench-baseline"
VERSION = 1
MIN_CORRELATION = 0.95
MIN_COMMON_POINTS = 3
PASS, FAIL = "PASS", "FAIL"


class BaselineError(ValueError):
    """Bad baseline input: the one line to print (exit 2)."""


def trainbench_version() -> str:
    return package_version() or "unknown"


# --- building and saving ------------------------------------------------------------------------

def loss_curve(group: RepeatGroup) -> dict[int, float]:
    """Per iteration, the mean loss of the plan's comparable runs (repeats of a
    deterministic plan log the same losses; the mean keeps any small drift honest)."""
    by_iter: dict[int, list[float]] = {}
    for r in group.used:
        for rec in r.records:
            if rec.loss is not None and math.isfinite(rec.loss):
                by_iter.setdefault(rec.iteration, []).append(rec.loss)
    return {it: statistics.fmean(v) for it, v in sorted(by_iter.items())}


def conditions_summary(group: RepeatGroup) -> dict | None:
    """The machine conditions of the plan's first run that recorded them (run.json)."""
    for r in group.used:
        path = Path(r.path) / RUN_FILE
        try:
            cond = json.loads(path.read_text()).get("conditions")
        except (OSError, ValueError, AttributeError):
            continue
        if not isinstance(cond, dict):
            continue
        gpus = cond.get("gpus") or []
        return {
            "trainbench": cond.get("trainbench"), "python": cond.get("python"),
            "torch": cond.get("torch"), "cuda": cond.get("cuda"), "nccl": cond.get("nccl"),
            "host": (cond.get("host") or {}).get("hostname"),
            "cpu": (cond.get("cpu") or {}).get("model"),
            "gpus": sorted({g.get("name") for g in gpus if isinstance(g, dict)} - {None}),
            "driver": next((g.get("driver") for g in gpus if isinstance(g, dict)), None),
        }
    return None


def baseline_entry(group: RepeatGroup) -> dict:
    st, tk = group.step_time, group.tokens_per_s
    curve = loss_curve(group)
    first = group.used[0]
    return {
        "plan": group.id, "label": group.label, "key": group.key,
        "step_time_s": {"mean": st.mean, "std": st.std, "n": st.n},
        "tokens_per_s": {"mean": tk.mean, "std": tk.std, "n": tk.n} if tk else None,
        "window": [first.window_start, first.window_end],
        "loss": {"iterations": list(curve), "values": list(curve.values())},
        "conditions": conditions_summary(group),
        "experiments": [r.path for r in group.used],
    }


def build_baseline(groups: list[RepeatGroup]) -> tuple[dict, list[str]]:
    """The baseline document of the plans with a comparable run, and one line per plan
    left out (none of its runs can be a baseline)."""
    entries, skipped = [], []
    for g in groups:
        if g.used:
            entries.append(baseline_entry(g))
        else:
            skipped.append(f"{g.label}: not in the baseline ({g.verdict})")
    doc = {"format": FORMAT, "version": VERSION, "trainbench": trainbench_version(),
           "plans": entries}
    return doc, skipped


def load_baseline_file(path: Path) -> dict[str, dict]:
    """Plan id -> entry of a baseline file; BaselineError saying what is wrong."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise BaselineError(f"baseline {path} does not exist; give a file written by "
                            "`trainbench results ... --save-baseline FILE` or experiment "
                            "directories") from None
    except (OSError, UnicodeDecodeError) as err:
        raise BaselineError(f"cannot read baseline {path}: "
                            f"{getattr(err, 'strerror', None) or err}") from None
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BaselineError(f"{path} is not a trainbench baseline file; write one with "
                            "`trainbench results DIR... --save-baseline FILE`")
    if doc.get("version") != VERSION:
        raise BaselineError(f"baseline {path} is version {doc.get('version')!r}, this "
                            f"trainbench reads version {VERSION}; save it again with "
                            "`trainbench results DIR... --save-baseline FILE`")
    entries = {}
    for entry in doc.get("plans") or []:
        try:
            key = entry["key"]
            float(entry["step_time_s"]["mean"])
            entry["loss"]["iterations"], entry["loss"]["values"]
        except (KeyError, TypeError, ValueError):
            raise BaselineError(f"baseline {path} has a malformed plan entry; save it again "
                                "with `trainbench results DIR... --save-baseline FILE`") from None
        entries[key_id(key)] = entry
    if not entries:
        raise BaselineError(f"baseline {path} holds no plan; save one from runs that "
                            "succeeded")
    return entries


# --- checking -----------------------------------------------------------------------------------

def pearson(xs: list[float], ys: list[float]) -> float | None:
    """Pearson's r of two equal-length series; None where a series is constant."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def loss_check(current: dict[int, float], base: dict[int, float]) -> tuple[bool, str]:
    """(passes, what was found) for the loss curves over their common iterations."""
    common = sorted(set(current) & set(base))
    if len(common) < MIN_COMMON_POINTS:
        return False, (f"loss correlation cannot be computed: {len(common)} common "
                       f"iteration(s) with the baseline, need {MIN_COMMON_POINTS}")
    xs, ys = [current[i] for i in common], [base[i] for i in common]
    r = pearson(xs, ys)
    if r is None:
        if all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9) for x, y in zip(xs, ys)):
            return True, f"loss curve identical (constant) over {len(common)} iterations"
        return False, "loss correlation cannot be computed: a loss curve is constant"
    if r < MIN_CORRELATION:
        return False, (f"loss curve correlation {r:.3f} < {MIN_CORRELATION} over "
                       f"{len(common)} iterations")
    return True, f"loss correlation {r:.3f} over {len(common)} iterations"


@dataclass
class GateLine:
    label: str
    plan: str
    verdict: str
    """PASS, FAIL, 'no baseline', 'missing' or 'no reference' (the last three fail)."""
    reason: str

    @property
    def passed(self) -> bool:
        return self.verdict == PASS

    def line(self) -> str:
        return f"{self.verdict.upper():<12} {self.label}: {self.reason}"

    def to_dict(self) -> dict:
        return {"plan": self.plan, "label": self.label, "verdict": self.verdict,
                "passed": self.passed, "reason": self.reason}


def _run_problem(group: RepeatGroup) -> str | None:
    bad = [r for r in group.results if r.status in (FAILED, INVALID, INCOMPLETE)]
    if bad:
        kinds = ", ".join(sorted({r.status for r in bad}))
        return f"{len(bad)} of {len(group.results)} run(s) {kinds}"
    if not group.used:
        return "no comparable successful run with steps in the window"
    return None


def _pct(ratio: float) -> str:
    return f"{abs(ratio - 1) * 100:.1f}%"


def check_baseline(groups: list[RepeatGroup], baseline: dict[str, dict],
                   tolerance_pct: float) -> list[GateLine]:
    lines = []
    tol = tolerance_pct / 100
    for g in groups:
        entry = baseline.get(g.id)
        if entry is None:
            lines.append(GateLine(g.label, g.id, "no baseline",
                                  "no plan of the baseline matches (fails: save a new "
                                  "baseline to add it)"))
            continue
        problem = _run_problem(g)
        if problem:
            lines.append(GateLine(g.label, g.id, FAIL, problem))
            continue
        reasons, ok = [], True
        base_t = float(entry["step_time_s"]["mean"])
        ratio = g.step_time.mean / base_t
        said = (f"step time {g.step_time.mean:.4g} s vs baseline {base_t:.4g} s "
                f"(n={g.step_time.n} vs {entry['step_time_s'].get('n')})")
        if ratio > 1 + tol:
            ok = False
            reasons.append(f"{said}: {_pct(ratio)} slower, beyond the {tolerance_pct:g}% "
                           "tolerance")
        elif ratio < 1 - tol:
            reasons.append(f"{said}: {_pct(ratio)} faster (passes; a faster baseline may "
                           "be due)")
        else:
            reasons.append(f"{said}: within {tolerance_pct:g}%")
        base_curve = dict(zip((int(i) for i in entry["loss"]["iterations"]),
                              (float(v) for v in entry["loss"]["values"])))
        loss_ok, loss_said = loss_check(loss_curve(g), base_curve)
        ok = ok and loss_ok
        reasons.append(loss_said)
        lines.append(GateLine(g.label, g.id, PASS if ok else FAIL, "; ".join(reasons)))
    present = {g.id for g in groups}
    for plan, entry in baseline.items():
        if plan not in present:
            lines.append(GateLine(entry.get("label") or plan_label(entry["key"]), plan,
                                  "missing", "in the baseline, but no run of it was given "
                                             "(fails: an acceptance gate runs every plan)"))
    return lines


def check_reference(groups: list[RepeatGroup], tolerance_pct: float) -> list[GateLine]:
    """Each plan against the published tables, as a cloud certification does."""
    lines = []
    need = 100 - tolerance_pct
    for g in groups:
        ref = reference_for(g.key)
        if ref is None:
            lines.append(GateLine(g.label, g.id, "no reference",
                                  "no published reference for this plan (not a pass)"))
            continue
        problem = _run_problem(g)
        if problem:
            lines.append(GateLine(g.label, g.id, FAIL, problem))
            continue
        if g.tokens_per_s is not None:
            pct = 100 * g.tokens_per_s.mean / ref.tokens_per_s
            what = f"{g.tokens_per_s.mean:,.0f} tokens/s"
        else:
            pct = 100 * ref.step_time_s / g.step_time.mean
            what = f"step time {g.step_time.mean:.4g} s"
        said = (f"{what} = {pct:.1f}% of the reference's {ref.tokens_per_s:,.0f} tokens/s "
                f"(n={g.step_time.n}; needs >= {need:g}%)")
        lines.append(GateLine(g.label, g.id, PASS if pct >= need else FAIL, said))
    return lines


def gate_summary(lines: list[GateLine], what: str) -> str:
    passed = sum(line.passed for line in lines)
    return (f"{what}: {passed} of {len(lines)} plan(s) pass, {len(lines) - passed} do not"
            + (" -> FAIL (exit 1)" if passed < len(lines) else " -> PASS"))


# --- the command's side: inputs, the verdicts, the output ------------------------------------

def _fail(message: str):
    raise InputError(message)


def check_inputs(baseline: list[Path] | None, save_path: Path | None, tolerance_pct: float,
                 window, convention, workload, size, dtype, scale, gpu) -> dict | None:
    """The baseline's plans (id -> entry), read before any run is; a bad option, a missing
    or foreign baseline file, a baseline directory without runs, or a --save-baseline file
    that exists: one line and exit 2, nothing written."""
    if not (0 < tolerance_pct < 100) or not math.isfinite(tolerance_pct):
        _fail(f"--tolerance {tolerance_pct:g} must be a percentage above 0 and below 100 "
              "(e.g. --tolerance 5)")
    if save_path is not None:
        if save_path.exists():
            _fail(f"--save-baseline {save_path} already exists; a baseline is never "
                  "overwritten: choose another file name or remove the old one first")
        if not save_path.parent.is_dir():
            _fail(f"--save-baseline {save_path}: {save_path.parent} does not exist")
    if not baseline:
        return None
    for path in baseline:
        if not path.exists():
            _fail(f"--baseline {path} does not exist; give a file written by `trainbench "
                  "results ... --save-baseline FILE` or earlier experiment directories")
    files = [p for p in baseline if not p.is_dir()]
    if files and len(baseline) > 1:
        _fail("--baseline takes one baseline file, or one or more experiment directories, "
              "not both")
    try:
        if files:
            return load_baseline_file(files[0])
        return _baseline_from_dirs(baseline, window, convention, workload, size, dtype, scale,
                                   gpu, tolerance_pct)
    except ValueError as err:  # BaselineError, or an option summarize_paths refuses
        _fail(str(err))


def _baseline_from_dirs(dirs: list[Path], window, convention, workload, size, dtype, scale,
                        gpu, tolerance_pct: float) -> dict[str, dict]:
    try:
        win = metrics.parse_window(window) if window else None
    except ValueError as err:
        raise BaselineError(f"--window: {err}") from None
    results = summarize_paths(dirs, window=win, convention=convention, workload=workload,
                              size=size, dtype=dtype, scale=scale, gpu=gpu,
                              tolerance_pct=tolerance_pct)
    where = ", ".join(map(str, dirs))
    if not results:
        raise BaselineError(f"--baseline {where}: no experiments found there; give earlier "
                            "experiment directories or a --save-baseline file")
    doc, _ = build_baseline(group_results(results, tolerance_pct))
    if not doc["plans"]:
        raise BaselineError(f"--baseline {where}: no run there succeeded with steps in its "
                            "window, so none can be a baseline")
    return {e["plan"]: e for e in doc["plans"]}


def save_baseline(path: Path, doc: dict) -> None:
    """Write a new baseline file through a temporary name (never half-written, never over
    an existing file)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=2)
            fh.write("\n")
        os.link(tmp, path)  # fails if the file appeared meanwhile: never overwrite
    except FileExistsError:
        raise BaselineError(f"--save-baseline {path} already exists; choose another file "
                            "name or remove the old one first") from None
    except OSError as err:
        raise BaselineError(f"cannot write --save-baseline {path}: {err.strerror}") from None
    finally:
        if "tmp" in locals() and os.path.exists(tmp):
            os.unlink(tmp)


@dataclass
class Gate:
    """What `results` adds for repeats, a saved baseline and the pass/fail checks."""

    groups: list[RepeatGroup]
    baseline: list[GateLine] | None = None
    reference: list[GateLine] | None = None
    tolerance_pct: float = 5.0
    saved: str | None = None
    skipped: list[str] | None = None

    @property
    def checked(self) -> bool:
        return self.baseline is not None or self.reference is not None

    @property
    def failed(self) -> bool:
        return any(not line.passed for line in (self.baseline or []) + (self.reference or []))

    def lines(self) -> list[str]:
        out = []
        if self.checked or self.saved or any(len(g.results) > 1 for g in self.groups):
            out += group_lines(self.groups)
        out += self.skipped or []
        if self.saved:
            out.append(self._saved_line())
        for title, lines in (("baseline", self.baseline), ("reference", self.reference)):
            if lines is None:
                continue
            out.append(f"{title} check (tolerance {self.tolerance_pct:g}%"
                       + (f", loss correlation >= {MIN_CORRELATION}" if title == "baseline"
                          else ", tokens/s vs the published tables") + "):")
            out += ["  " + line.line() for line in lines]
            out.append(gate_summary(lines, f"{title} check"))
        return out

    def _saved_line(self) -> str:
        return f"wrote baseline {self.saved}"

    def json(self) -> dict:
        data: dict = {"plans": [g.to_dict() for g in self.groups]}
        for title, lines in (("baseline_check", self.baseline),
                             ("reference_check", self.reference)):
            if lines is not None:
                data[title] = {"tolerance_pct": self.tolerance_pct,
                               "passed": all(line.passed for line in lines),
                               "plans": [line.to_dict() for line in lines]}
        if self.saved:
            data["saved_baseline"] = self.saved
        return data

    def csv_columns(self, results) -> list[dict]:
        by_path = {}
        for g in self.groups:
            cols = csv_columns(g)
            for title, lines in (("baseline", self.baseline), ("reference", self.reference)):
                if lines is not None:
                    line = next((x for x in lines if x.plan == g.id), None)
                    cols[f"{title}_verdict"] = line.verdict if line else ""
                    cols[f"{title}_reason"] = line.reason if line else ""
            for r in g.results:
                by_path[id(r)] = cols
        return [by_path[id(r)] for r in results]

    def finish(self, fmt: str) -> int:
        """After the output: the saved-file line where stdout holds data; the command's
        exit code, 1 when a check failed."""
        if self.saved and fmt != "table":
            print(self._saved_line(), file=sys.stderr)
        return 1 if self.failed else 0


def run_gate(results, baseline: dict[str, dict] | None, reference: bool,
             save_path: Path | None, tolerance_pct: float) -> Gate:
    groups = group_results(results, tolerance_pct)
    gate = Gate(groups, tolerance_pct=tolerance_pct)
    if save_path is not None:
        doc, gate.skipped = build_baseline(groups)
        if not doc["plans"]:
            _fail(f"--save-baseline {save_path}: no run succeeded with steps in its window, "
                  "so there is nothing to save")
        try:
            save_baseline(save_path, doc)
        except BaselineError as err:
            _fail(str(err))
        gate.saved = str(save_path)
    if baseline is not None:
        gate.baseline = check_baseline(groups, baseline, tolerance_pct)
    if reference:
        gate.reference = check_reference(groups, tolerance_pct)
    return gate
