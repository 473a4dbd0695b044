"""trainbench's own metrics.jsonl: one StepMetrics object per line, written by the engine."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from ..files import open_regular
from .parse import (_INT_FIELDS, _NUM, CHUNK_SIZE, MAX_ITERATION, MAX_JSONL_LINE, LogScan,
                    StepRecord, number)


# --- trainbench's metrics.jsonl ------------------------------------------------------------

class _OutOfRange(ValueError):
    """A JSON number beyond what its field can hold (an integer of 400 digits)."""


_JSON_NUMBER_TEXT = re.compile(_NUM, re.I | re.A)
_MAX_JSON_INT = 2**63
"""Counts and byte sizes past this are no run's (and past a float's range, float() fails)."""


def _number(value) -> float | None:
    """A JSON value as float (the engine writes NaN/inf as the strings 'nan'/'inf'); None
    where it is no number; _OutOfRange for an integer beyond _MAX_JSON_INT."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        if abs(value) > _MAX_JSON_INT:
            raise _OutOfRange
        return float(value)
    if isinstance(value, float):
        return value
    if isinstance(value, str) and len(value) <= 40 and _JSON_NUMBER_TEXT.fullmatch(value):
        return number(value)
    return None


def _int_or_none(value) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > _MAX_JSON_INT:
            raise _OutOfRange
        return value
    number_ = _number(value)
    return int(number_) if number_ is not None and math.isfinite(number_) else None


def read_metrics_jsonl(path: str | Path) -> LogScan:
    """trainbench's metrics.jsonl (one StepMetrics object per line). A malformed or
    truncated line is skipped, a line longer than MAX_JSONL_LINE is skipped unread, and a
    value beyond its field's range (an integer of 400 digits, an iteration past
    MAX_ITERATION) is left out of that field (or, for the iteration, the line); the notes
    count what was left out. files.NotRegularFile for a FIFO, device or directory."""
    scan = LogScan(Path(path), format="trainbench")
    by_iteration: dict[int, StepRecord] = {}
    long_lines = 0
    refused: list[str] = []
    with open_regular(path) as fh:
        while raw := fh.readline(MAX_JSONL_LINE + 1):
            scan.bytes_read += len(raw)
            if not raw.endswith(b"\n"):
                if len(raw) > MAX_JSONL_LINE:
                    long_lines += 1
                    scan.bytes_read += _skip_line(fh)
                    continue
                scan.truncated_last_line = True
            try:
                data = json.loads(raw)
                iteration = data["iteration"]
            except (ValueError, KeyError, TypeError, RecursionError):
                continue
            if (not isinstance(iteration, int) or isinstance(iteration, bool)
                    or not 0 <= iteration <= MAX_ITERATION):
                if isinstance(iteration, (int, float)) and not isinstance(iteration, bool):
                    refused.append("iteration")
                continue
            rec = StepRecord(iteration)
            for name in ("total_iterations", "step_time_s", "tflops_per_gpu", "loss",
                         "grad_norm", *sorted(_INT_FIELDS)):
                convert = _number if name in _FLOAT_FIELDS else _int_or_none
                try:
                    setattr(rec, name, convert(data.get(name)))
                except _OutOfRange:
                    refused.append(f"{name} at iteration {iteration}")
            if rec.total_iterations is not None and not 0 < rec.total_iterations <= MAX_ITERATION:
                rec.total_iterations = None
            if rec.step_time_s is not None:
                by_iteration[iteration] = rec
    scan.records = sorted(by_iteration.values(), key=lambda r: r.iteration)
    if long_lines:
        scan.notes.append(f"metrics.jsonl: {long_lines} line(s) longer than "
                          f"{MAX_JSONL_LINE // 2**20} MiB skipped")
    if refused:
        scan.notes.append(f"metrics.jsonl: {len(refused)} value(s) beyond their field's range "
                          f"left out (first: {refused[0]})")
    if not scan.records:
        scan.format = None
    return scan


_FLOAT_FIELDS = {"step_time_s", "tflops_per_gpu", "loss", "grad_norm"}


def _skip_line(fh) -> int:
    """Read past the rest of an over-long line, a chunk at a time; bytes read."""
    skipped = 0
    while chunk := fh.readline(CHUNK_SIZE):
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped
