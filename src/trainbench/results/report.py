"""Results as a rich table, CSV or JSON, with a summary line. No torch; rich is imported
only by the table renderer."""

from __future__ import annotations

import csv
import io
import json
import os
from collections import Counter
from dataclasses import fields

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from .parse import formats_read
from .status import FAILED, INCOMPLETE, INVALID, RATED, RUNNING, STATUSES, SUCCESS, UNRECOGNISED
from .summary import ExperimentResult

FORMATS = ("table", "csv", "json")

# Short names accepted by --sort, besides every field of ExperimentResult.
SORT_ALIASES = {
    "step_time": "step_time_mean_s",
    "step": "step_time_mean_s",
    "tokens": "tokens_per_s",
    "tokens_per_gpu": "tokens_per_s_per_gpu",
    "tflops": "tflops_per_gpu",
    "mfu": "mfu_pct",
    "days": "days_per_1t_tokens",
    "memory": "peak_memory_gib",
    "ref": "pct_of_ref_tokens_per_s",
}
SORTABLE = tuple(f.name for f in fields(ExperimentResult)
                 if f.name not in ("records", "notes", "facts"))


def sort_key_name(column: str) -> tuple[str, bool]:
    """'--sort -mfu' -> ('mfu_pct', descending=True); ValueError for an unknown column."""
    descending = column.startswith("-")
    name = column.lstrip("-").strip().lower()
    name = SORT_ALIASES.get(name, name)
    if name not in SORTABLE:
        raise ValueError(f"cannot sort by {column!r}; use one of "
                         f"{', '.join(sorted(SORT_ALIASES))} or a field: {', '.join(SORTABLE)}"
                         " (prefix '-' for descending, e.g. --sort=-mfu)")
    return name, descending


def sort_results(results: list[ExperimentResult], column: str | None) -> list[ExperimentResult]:
    """Sorted by a column (missing values last); by default grouped by workload, size,
    dtype and scale."""
    if not column:
        return sorted(results, key=lambda r: (r.workload or "~", r.size or "", r.dtype or "",
                                              r.gpus or 0, r.name))
    name, descending = sort_key_name(column)
    have = [r for r in results if getattr(r, name) is not None]
    missing = [r for r in results if getattr(r, name) is None]
    have.sort(key=lambda r: getattr(r, name), reverse=descending)
    return have + missing


def summary(results: list[ExperimentResult]) -> dict:
    """Counts per status; the success rate is over the runs whose logs could be read
    (an unrecognised log says nothing about its run)."""
    counts = Counter(r.status for r in results)
    rated = sum(counts.get(s, 0) for s in RATED)
    return {
        "experiments": len(results),
        **{status.lower(): counts.get(status, 0) for status in STATUSES},
        "success_rate_pct": 100.0 * counts.get(SUCCESS, 0) / rated if rated else 0.0,
    }


def summary_line(results: list[ExperimentResult]) -> str:
    s = summary(results)
    shown = [st for st in STATUSES if st in RATED or s[st.lower()]]
    parts = ", ".join(f"{s[st.lower()]} {st}" for st in shown)
    rated = sum(s[st.lower()] for st in RATED)
    conventions = sorted({r.mfu_convention for r in results if r.mfu_convention})
    line = (f"{s['experiments']} experiment(s): {parts}; success rate "
            f"{s['success_rate_pct']:.0f}% ({s[SUCCESS.lower()]}/{rated}"
            + (" readable" if s[UNRECOGNISED.lower()] else "")
            + (" ended" if s[RUNNING.lower()] else "") + ")")
    if conventions:
        line += f"; MFU convention: {', '.join(conventions)}"
    return line


def unrecognised_line(results: list[ExperimentResult]) -> str | None:
    """One line naming the formats trainbench reads, when some log was in none of them."""
    n = sum(r.status == UNRECOGNISED for r in results)
    if not n:
        return None
    return (f"{n} log(s) in a format trainbench does not read, left out of the success rate; "
            f"formats read: {formats_read()}")


# --- CSV and JSON ---------------------------------------------------------------------------

def to_csv(results: list[ExperimentResult], extra: list[dict] | None = None) -> str:
    """extra: per result, columns appended after its own (the plan's repeats statistics)."""
    buf = io.StringIO()
    names = [f.name for f in fields(ExperimentResult) if f.name != "records"]
    if extra:
        names += [k for k in extra[0] if k not in names]
    writer = csv.DictWriter(buf, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    for i, r in enumerate(results):
        row = r.to_dict()
        if extra:
            row.update(extra[i])
        row["notes"] = "; ".join(row["notes"])
        row["facts"] = json.dumps(row["facts"], sort_keys=True) if row["facts"] else ""
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buf.getvalue()


def to_json(results: list[ExperimentResult], with_records: bool = False,
            extra: dict | None = None) -> str:
    """extra: more top-level keys (the plans' repeats statistics, a baseline verdict)."""
    return json.dumps({"summary": summary(results),
                       "experiments": [r.to_dict(with_records) for r in results],
                       **(extra or {})}, indent=2)


# --- the rich table -------------------------------------------------------------------------

def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _step(r: ExperimentResult) -> str:
    if r.step_time_mean_s is None:
        return "-"
    return f"{r.step_time_mean_s:.4g}±{r.step_time_std_s:.2g}"


def _mfu(r: ExperimentResult) -> str:
    if r.mfu_problem:  # the reason is one of the run's detail lines below the table
        return "INVALID"
    return ("-" if r.mfu_pct is None else f"{r.mfu_pct:.3g}%"
            + (" (GEMM)" if r.peak_source == "measured GEMM" else ""))


_STATUS_STYLE = {SUCCESS: "green", INCOMPLETE: "yellow", FAILED: "red", INVALID: "magenta",
                 UNRECOGNISED: "blue", RUNNING: "cyan"}

TABLE_COLUMNS = (
    # header, cell, justify; only the experiment name may wrap.
    ("experiment", lambda r: r.name, "left"),
    ("status", lambda r: r.status, "left"),
    ("fmt", lambda r: r.format or "-", "left"),
    ("workload", lambda r: " ".join(x for x in ((r.workload or "?").replace("pretrain_", ""),
                                                r.size or "?", r.dtype or "?")), "left"),
    ("GPUs", lambda r: f"{r.gpus or '?'} {r.gpu_type or ''}".strip(), "right"),
    ("GBS", lambda r: _num(r.gbs, "d"), "right"),
    ("window", lambda r: f"{r.window_start}-{r.window_end}" if r.window else "-", "right"),
    ("step s±sd", _step, "right"),
    ("tokens/s", lambda r: _num(r.tokens_per_s, ",.0f"), "right"),
    ("tok/s/GPU", lambda r: _num(r.tokens_per_s_per_gpu, ",.0f"), "right"),
    ("TFLOPS/GPU", lambda r: _num(r.tflops_per_gpu, ".4g")
     + (" (log)" if r.tflops_source == "log" else ""), "right"),
    ("MFU", lambda r: _mfu(r), "right"),
    ("days/1T", lambda r: _num(r.days_per_1t_tokens, ".4g"), "right"),
    ("mem GiB", lambda r: _num(r.peak_memory_gib, ".1f"), "right"),
    ("%ref step", lambda r: "-" if r.pct_of_ref_step_time is None
     else f"{r.pct_of_ref_step_time:.1f}%", "right"),
    ("%ref tok/s", lambda r: "-" if r.pct_of_ref_tokens_per_s is None
     else f"{r.pct_of_ref_tokens_per_s:.1f}%", "right"),
    ("vs predict", lambda r: "-" if r.step_time_vs_predicted_pct is None
     else f"{round(r.step_time_vs_predicted_pct):+d}%", "right"),
    ("J/token", lambda r: _num(r.energy_per_token_j, ".3g"), "right"),
    ("verdict", lambda r: r.verdict, "left"),
)


# Which columns a narrow terminal keeps, most important first: the run, its status and the
# verdict, then what it ran and its key figures. The experiment name folds onto more lines
# (at least NAME_WIDTH wide); every other cell stays on one line, whole.
COLUMN_PRIORITY = ("experiment", "status", "verdict", "workload", "GPUs", "step s±sd",
                   "tokens/s", "MFU", "TFLOPS/GPU", "mem GiB", "%ref tok/s", "fmt", "GBS",
                   "window", "tok/s/GPU", "days/1T", "%ref step", "vs predict", "J/token")
NAME_WIDTH = 20


def fitted_columns(results: list[ExperimentResult], width: int | None
                   ) -> tuple[list[tuple], int | None]:
    """(the columns of TABLE_COLUMNS that fit `width` characters, in their table order;
    the experiment column's width). None: no limit, every column and the names whole.
    Each column costs its widest cell and 3 characters of padding and rule."""
    natural = {header: max([cell_len(header)] + [cell_len(cell(r)) for r in results])
               for header, cell, _ in TABLE_COLUMNS}
    if width is None:
        return list(TABLE_COLUMNS), None
    name = min(natural["experiment"], NAME_WIDTH)
    used = 1 + name + 3  # the left rule, then the experiment column
    kept = {"experiment"}
    for header in COLUMN_PRIORITY[1:]:
        if header != "status" and used + natural[header] + 3 > width:
            break  # the columns after it matter less: the room left goes to the names
        used += natural[header] + 3
        kept.add(header)
    name += max(0, min(natural["experiment"] - name, width - used))
    return [c for c in TABLE_COLUMNS if c[0] in kept], name


def build_table(results: list[ExperimentResult], title: str = "trainbench results",
                width: int | None = None):
    """The results table; with `width`, only the columns that fit it (fitted_columns)."""
    columns, name_width = fitted_columns(results, width)
    table = Table(title=title)
    for header, _, justify in columns:
        if header == "experiment":
            table.add_column(header, justify=justify, overflow="fold", min_width=NAME_WIDTH,
                             width=name_width)
        else:
            table.add_column(header, justify=justify, no_wrap=True)
    for r in results:
        # Text cells: names from the file system are never read as rich markup.
        table.add_row(*(Text(cell(r), style=_STATUS_STYLE[r.status] if header == "status" else "")
                        for header, cell, _ in columns))
    return table


def table_width(console) -> int | None:
    """The width the table must fit: COLUMNS where it is set (as `ls` and rich honour
    it), else the terminal's; None (no limit) when piped or written to a file."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isascii() and columns.isdigit() and int(columns) >= 40:
        return int(columns)
    return console.width if console.is_terminal else None


def detail_lines(results: list[ExperimentResult]) -> list[str]:
    """One line per run that needs explaining: why it is not a success, and its notes."""
    lines = []
    for r in results:
        said = []
        if r.status != SUCCESS or r.status_detail:
            status = f"{r.status} ({r.failure_class})" if r.failure_class else r.status
            said.append(f"{status}: {r.status_detail}" if r.status_detail else status)
        said.extend(r.notes)
        if said:
            lines.append(f"{r.name}: " + "; ".join(said))
    return lines


def print_table(results: list[ExperimentResult], console, convention: str,
                fit: bool = True) -> None:
    """The table, the detail lines and the summary. fit: keep to the terminal's width
    (table_width), leaving out the columns that do not fit and saying which; else (piped,
    a file) every column, whole."""
    width = table_width(console) if fit else None
    if width is None:
        # Piped or written to a file: nothing limits the width, so no cell is cut.
        console.width = max(console.width, 400)
    else:
        console.width = width
    console.print(build_table(results, title=f"trainbench results (FLOPs convention: "
                                             f"{convention})", width=width))
    shown = {c[0] for c in fitted_columns(results, width)[0]}
    left_out = [header for header, _, _ in TABLE_COLUMNS if header not in shown]
    if left_out:
        console.print(f"left out to fit {width} columns: {', '.join(left_out)} (a wider "
                      "terminal, COLUMNS=250, or --format csv|json shows every field)",
                      markup=False, highlight=False)
    for line in detail_lines(results):
        console.print(line, markup=False, highlight=False)
    console.print(summary_line(results), markup=False, highlight=False)
    unknown = unrecognised_line(results)
    if unknown:
        console.print(unknown, markup=False, highlight=False)
