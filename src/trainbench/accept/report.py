"""The acceptance run's one table, as text for the terminal, Markdown and JSON, and the
findings: every run whose step time or peak memory is more than 15% from predict's."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .checks import SUCCESS, RowResult
from .machine import Machine
from .rows import TRAIN

MISMATCH = 0.15
"""A measured figure further than this from predict's is a finding."""

COLUMNS = ("run", "model", "status", "s/step", "predict", "Δ", "MFU", "predict", "peak GiB",
           "predict", "Δ")


@dataclass
class Report:
    machine: Machine
    command: str
    started: str
    rows: list[RowResult] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def findings(self) -> list[str]:
        found = []
        for r in self.rows:
            if r.kind != TRAIN or r.status != SUCCESS:
                continue
            for what, got, want, unit in (("step time", r.step_s, r.pred_step_s, "s"),
                                          ("peak memory", r.memory_gib, r.pred_memory_gib,
                                           "GiB")):
                gap = _gap(got, want)
                if gap is not None and abs(gap) > MISMATCH:
                    found.append(f"{r.label}: {what} {got:.4g} {unit} is {100 * gap:+.0f}% "
                                 f"from predict's {want:.4g} {unit}")
        return found

    @property
    def failed(self) -> list[RowResult]:
        return [r for r in self.rows if r.status != SUCCESS]

    def to_dict(self) -> dict:
        return {"format": "trainbench-acceptance", "version": 1, "command": self.command,
                "started": self.started, "elapsed_s": round(self.elapsed_s, 1),
                "machine": self.machine.to_dict(), "rows": [r.to_dict() for r in self.rows],
                "findings": self.findings, "skipped": self.skipped, "notes": self.notes}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def _gap(got: float | None, want: float | None) -> float | None:
    return None if got is None or not want else got / want - 1


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


def cells(r: RowResult) -> list[str]:
    step_gap, mem_gap = _gap(r.step_s, r.pred_step_s), _gap(r.memory_gib, r.pred_memory_gib)
    return [r.label, r.shape, r.status, _fmt(r.step_s, ".4g"), _fmt(r.pred_step_s, ".4g"),
            _fmt(None if step_gap is None else 100 * step_gap, "+.0f", "%"),
            _fmt(r.mfu_pct, ".1f", "%"), _fmt(r.pred_mfu_pct, ".1f", "%"),
            _fmt(r.memory_gib, ".3g"), _fmt(r.pred_memory_gib, ".3g"),
            _fmt(None if mem_gap is None else 100 * mem_gap, "+.0f", "%")]


def machine_line(m: Machine) -> str:
    where = (f"no GPU found: tiny sizes on the CPU ({m.device})" if m.on_cpu
             else f"{m.gpus} x {m.device}, driver {m.driver or '?'}")
    return (f"{where}; torch {m.torch or 'missing'}, torchao {m.torchao or 'missing'}, "
            f"Python {m.python}, trainbench {m.trainbench or '?'}")


def _tail(report: Report) -> list[str]:
    lines = []
    for r in report.rows:
        for text in (r.note, r.detail):
            if text:
                lines.append(f"{r.label}: {text}")
        if r.memory_reserved_gib is not None:
            lines.append(f"{r.label}: peak {r.memory_gib:.3g} GiB allocated, "
                         f"{r.memory_reserved_gib:.3g} GiB reserved by the allocator")
    lines += [f"finding: {f}" for f in report.findings]
    lines += [f"skipped: {s}" for s in report.skipped]
    lines += report.notes
    ok = len(report.rows) - len(report.failed)
    lines.append(f"{ok} of {len(report.rows)} rows succeeded in {report.elapsed_s:.0f} s"
                 + (f"; {len(report.findings)} finding(s)" if report.findings else ""))
    return lines


def text(report: Report) -> str:
    """The table as fixed-width text: one line a row, then what each row found."""
    rows = [list(COLUMNS)] + [cells(r) for r in report.rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    out = [machine_line(report.machine), ""]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    out += [""] + _tail(report)
    return "\n".join(out) + "\n"


def markdown(report: Report) -> str:
    out = ["# trainbench acceptance run", "", f"`{report.command}`, started {report.started}",
           "", f"Machine: {machine_line(report.machine)}", "",
           "Step time is the mean over the run's window (results' iterations); predict's "
           "figures are `trainbench predict` for the same plan with trainbench's engine as "
           f"the sharding. A gap over {100 * MISMATCH:.0f}% is a finding. MFU uses the "
           "published FLOPs. Peak memory on a GPU is the allocator's peak of allocated "
           "bytes, which predict counts (the reserved peak is listed below the table).", "",
           "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in cells(r)) + " |"
            for r in report.rows]
    out += [""] + [f"- {line}" for line in _tail(report)]
    return "\n".join(out) + "\n"
