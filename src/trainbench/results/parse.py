"""Read training logs into step records: trainbench (log and metrics.jsonl), NeMo 2,
NeMo 1 progress bars, Megatron-LM / Megatron-Bridge and MaxText. Pure Python, no torch.

Logs with an NCCL trace reach several GB, almost all of it `NCCL INFO` lines, so a file
is read in large binary chunks and searched with `bytes.find` for a few marker strings;
only the lines around a hit are decoded and parsed. Once the first step line names the
format, only that format's markers are searched. Iterations are 0-based everywhere
(NeMo's `iteration 49/49` is the 50th step; Megatron's 1-based `iteration 50/50` is
stored as 49).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

CHUNK_SIZE = 16 * 2**20
# A line longer than this with no newline (a runaway progress bar) is cut here rather
# than held in memory whole.
MAX_LINE = 64 * 2**20

FORMATS = ("trainbench", "nemo2", "nemo1", "megatron", "maxtext")


@dataclass
class StepRecord:
    """One training step as a log reports it; None where the log does not print a field."""

    iteration: int
    """0-based."""
    total_iterations: int | None = None
    """Steps the run was asked for (50 for `iteration 49/49`); None when not printed."""
    step_time_s: float | None = None
    tflops_per_gpu: float | None = None
    """The log's own TFLOPS figure (its own FLOPs convention)."""
    loss: float | None = None
    grad_norm: float | None = None
    peak_memory_bytes: int | None = None
    memory_allocated_bytes: int | None = None
    consumed_samples: int | None = None
    global_batch_size: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def nonfinite_field(self) -> str | None:
        """'loss' or 'grad_norm' when that value is NaN or infinite, else None."""
        for name in ("loss", "grad_norm"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                return name
        return None


@dataclass
class LogScan:
    """What one pass over a log file found."""

    path: Path
    format: str | None = None
    """One of FORMATS, or None when no step line was found."""
    records: list[StepRecord] = field(default_factory=list)
    """Step records with a step time, sorted by iteration, one per iteration (the last
    printed wins, so a progress bar redrawn or a rank printing twice counts once)."""
    config: dict[str, str] = field(default_factory=dict)
    """Run settings the log prints (MaxText's `Config param steps: 50`)."""
    peak_memory_bytes: int | None = None
    """A peak printed outside the step lines (Megatron's `memory (MB)` report)."""
    bytes_read: int = 0
    truncated_last_line: bool = False
    """The file ended without a newline (a run still writing, or killed mid-line)."""

    @property
    def total_iterations(self) -> int | None:
        for rec in reversed(self.records):
            if rec.total_iterations:
                return rec.total_iterations
        steps = self.config.get("steps")
        return int(steps) if steps and steps.isdigit() else None


# --- numbers and key/value pairs ---------------------------------------------------------

_NUM = r"[-+]?(?:nan|inf(?:inity)?|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"
# `key: value` (NeMo 2, Megatron, MaxText) or `key=value` (NeMo 1 progress bars). Keys
# may hold spaces, parentheses and slashes: `elapsed time per iteration (ms): 20289.1`.
_KV = re.compile(r"([A-Za-z_][\w ()/.\-]*?)\s*[:=]\s*(" + _NUM + r")(?![\w.])", re.I)
_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)")
_PROGRESS = re.compile(r"(\d+)/(\d+|\?)\s*\[")
_MAXTEXT_STEP = re.compile(r"completed step:\s*(\d+)")
_TFLOPS_AFTER_UNIT = re.compile(r"TFLOP/s/GPU\)?\s*:\s*(" + _NUM + ")", re.I)
_TFLOPS_BEFORE_UNIT = re.compile(r"(\d+(?:\.\d*)?)\s*(?:MODEL_)?TFLOP/s/GPU")
_BRIDGE_STEP_TIME = re.compile(r"Step Time\s*:\s*(\d+(?:\.\d*)?)\s*s")
_MAXTEXT_CONFIG = re.compile(r"Config param (\w+): (\S+)")

# Normalised key -> (StepRecord field, scale). Keys are lower-cased, spaces collapsed.
_FIELD_KEYS: dict[str, tuple[str, float]] = {
    "train_step_timing in s": ("step_time_s", 1.0),
    "elapsed time per iteration (ms)": ("step_time_s", 1e-3),
    "seconds": ("step_time_s", 1.0),
    "tflops_per_gpu": ("tflops_per_gpu", 1.0),
    "throughput per gpu (tflop/s/gpu)": ("tflops_per_gpu", 1.0),
    "tflop/s/device": ("tflops_per_gpu", 1.0),
    "reduced_train_loss": ("loss", 1.0),
    "train_loss": ("loss", 1.0),
    "lm loss": ("loss", 1.0),
    "loss": ("loss", 1.0),
    "grad_norm": ("grad_norm", 1.0),
    "grad norm": ("grad_norm", 1.0),
    "peak_memory_usage": ("peak_memory_bytes", 1.0),
    "max_memory_reserved": ("peak_memory_bytes", 1.0),
    "memory_allocated": ("memory_allocated_bytes", 1.0),
    "max_memory_allocated": ("memory_allocated_bytes", 1.0),
    "consumed_samples": ("consumed_samples", 1.0),
    "consumed samples": ("consumed_samples", 1.0),
    "global_batch_size": ("global_batch_size", 1.0),
    "global batch size": ("global_batch_size", 1.0),
}
_INT_FIELDS = {"peak_memory_bytes", "memory_allocated_bytes", "consumed_samples",
               "global_batch_size"}


def key_values(text: str) -> dict[str, float]:
    """Every `key: number` / `key=number` pair of a line, keys normalised."""
    out = {}
    for key, value in _KV.findall(text):
        out[" ".join(key.lower().split())] = float(value)
    return out


def _fill(rec: StepRecord, pairs: dict[str, float]) -> None:
    for key, value in pairs.items():
        target = _FIELD_KEYS.get(key)
        if target is None:
            continue
        name, scale = target
        value *= scale
        if name in _INT_FIELDS:
            if not math.isfinite(value):
                continue
            value = int(round(value))
        setattr(rec, name, value)


def _cut_truncated(text: str) -> str:
    """Drop what follows the last field separator of a line the file ended in the middle
    of: `train_step_timing in s: 12.` must not be read as 12.0."""
    cut = max(text.rfind("|"), text.rfind(","), text.rfind("]"))
    return text[:cut + 1] if cut >= 0 else ""


# --- one parser per format: text of one line (or progress-bar segment) -> record -------

def parse_nemo2_line(text: str) -> StepRecord | None:
    """`Training epoch 0, iteration 49/49 | ... | train_step_timing in s: 12.39 | ...`
    (also trainbench's own log line, which adds grad_norm and TFLOPS_per_GPU)."""
    pairs = key_values(text)
    match = _ITERATION.search(text)
    if match:
        iteration, last = int(match.group(1)), int(match.group(2))
        total = last + 1
    elif "global_step" in pairs and math.isfinite(pairs["global_step"]):
        iteration, total = int(pairs["global_step"]), None
    else:
        return None
    rec = StepRecord(iteration, total)
    _fill(rec, pairs)
    return rec


def parse_nemo1_segment(text: str) -> StepRecord | None:
    """One NeMo 1 progress-bar update:
    `Epoch 0: : 100%|...| 100/100 [07:57<00:00, reduced_train_loss=7.310, global_step=99.00,
    consumed_samples=25600.0, train_step_timing in s=3.590]`."""
    pairs = key_values(text)
    step = pairs.get("global_step")
    if step is None or not math.isfinite(step):
        return None
    total = None
    match = _PROGRESS.search(text)
    if match and match.group(2) != "?":
        total = int(match.group(2))
    rec = StepRecord(int(step), total)
    _fill(rec, pairs)
    return rec


def parse_megatron_line(text: str) -> StepRecord | None:
    """`iteration   12/  50 | consumed samples: ... | elapsed time per iteration (ms):
    20289.1 | ... | lm loss: ... | grad norm: ...` (1-based iteration, stored 0-based)."""
    match = _ITERATION.search(text)
    if not match:
        return None
    rec = StepRecord(int(match.group(1)) - 1, int(match.group(2)))
    _fill(rec, key_values(text))
    if rec.tflops_per_gpu is None:
        rec.tflops_per_gpu = megatron_tflops(text)
    return rec


def megatron_tflops(text: str) -> float | None:
    """TFLOPS from `... 663.5MODEL_TFLOP/s/GPU` or `throughput per GPU (TFLOP/s/GPU): 420.1`."""
    match = _TFLOPS_AFTER_UNIT.search(text) or _TFLOPS_BEFORE_UNIT.search(text)
    return float(match.group(1)) if match else None


def parse_maxtext_line(text: str) -> StepRecord | None:
    """`completed step: 49, seconds: 7.908, TFLOP/s/device: 460.480, Tokens/s/device:
    1035.970, total_weights: 524288, loss: 0.000` (0-based steps; no total printed)."""
    match = _MAXTEXT_STEP.search(text)
    if not match:
        return None
    rec = StepRecord(int(match.group(1)))
    _fill(rec, key_values(text))
    return rec


# --- the streaming scanner ---------------------------------------------------------------

# Primary markers name a format; secondary markers carry extra data for a format.
_NEMO = b"train_step_timing"
_MEGATRON = b"elapsed time per iteration"
_MAXTEXT = b"completed step:"
_TFLOPS = b"TFLOP/s/GPU"
_MEMORY = b"memory (MB)"
_CONFIG = b"Config param "
_ALL_MARKERS = (_NEMO, _MEGATRON, _MAXTEXT, _TFLOPS, _MEMORY, _CONFIG)
_MARKERS_AFTER_DETECTION = {
    "nemo2": (_NEMO,),
    "nemo1": (_NEMO,),
    "megatron": (_MEGATRON, _TFLOPS, _MEMORY),
    "maxtext": (_MAXTEXT,),
}


class _Accumulator:
    """Collects records per format while the scanner feeds it lines in file order."""

    def __init__(self, scan: LogScan):
        self.scan = scan
        self.by_format: dict[str, dict[int, StepRecord]] = {}
        self.detected: str | None = None
        # Megatron-Bridge prints `Step Time : 9.09s GPU utilization: 663.5MODEL_TFLOP/s/GPU`
        # on its own line next to the iteration line; it is matched to its iteration by
        # step time, whichever of the two lines comes first.
        self.pending_tflops: tuple[float, float | None] | None = None
        self.last_megatron: StepRecord | None = None

    def markers(self) -> tuple[bytes, ...]:
        return _MARKERS_AFTER_DETECTION.get(self.detected, _ALL_MARKERS)

    def _store(self, fmt: str, rec: StepRecord | None) -> None:
        if rec is None:
            return
        self.by_format.setdefault(fmt, {})[rec.iteration] = rec
        if self.detected is None and rec.step_time_s is not None:
            self.detected = fmt

    def feed(self, raw: bytes, truncated: bool) -> None:
        text = raw.decode("utf-8", "replace")
        if truncated:
            text = _cut_truncated(text)
        if "train_step_timing" in text:
            after = text.split("train_step_timing in s", 1)[-1].lstrip()
            if after.startswith("="):
                self._store("nemo1", parse_nemo1_segment(text))
            else:
                self._store("nemo2", parse_nemo2_line(text))
        elif "elapsed time per iteration" in text or (
                "TFLOP/s/GPU" in text and _ITERATION.search(text)):
            self._megatron_iteration(text)
        elif "completed step:" in text:
            self._store("maxtext", parse_maxtext_line(text))
        elif "TFLOP/s/GPU" in text:
            self._megatron_tflops_line(text)
        elif "memory (MB)" in text:
            pairs = key_values(text)
            peak = pairs.get("max reserved", pairs.get("max allocated"))
            if peak is not None and math.isfinite(peak):
                peak_bytes = int(peak * 2**20)
                self.scan.peak_memory_bytes = max(self.scan.peak_memory_bytes or 0, peak_bytes)
        elif "Config param" in text:
            match = _MAXTEXT_CONFIG.search(text)
            if match:
                self.scan.config[match.group(1)] = match.group(2)

    def _megatron_iteration(self, text: str) -> None:
        rec = parse_megatron_line(text)
        if rec is None:
            return
        records = self.by_format.setdefault("megatron", {})
        old = records.get(rec.iteration)
        if old is not None:  # a second line about the same iteration adds its fields
            for f in fields(rec):
                if getattr(rec, f.name) is None:
                    setattr(rec, f.name, getattr(old, f.name))
        if rec.tflops_per_gpu is None and self.pending_tflops is not None:
            value, step_time = self.pending_tflops
            if _same_step_time(step_time, rec.step_time_s):
                rec.tflops_per_gpu = value
        self.pending_tflops = None
        self._store("megatron", rec)
        self.last_megatron = rec

    def _megatron_tflops_line(self, text: str) -> None:
        value = megatron_tflops(text)
        if value is None:
            return
        match = _BRIDGE_STEP_TIME.search(text)
        step_time = float(match.group(1)) if match else None
        last = self.last_megatron
        if (last is not None and last.tflops_per_gpu is None
                and _same_step_time(step_time, last.step_time_s)):
            last.tflops_per_gpu = value
        else:
            self.pending_tflops = (value, step_time)

    def finish(self) -> None:
        if not self.by_format:
            return
        # A file holds one run; should two formats appear, the one with most steps wins.
        fmt = self.detected or max(self.by_format, key=lambda k: len(self.by_format[k]))
        records = [r for r in self.by_format.get(fmt, {}).values() if r.step_time_s is not None]
        if not records:
            return
        records.sort(key=lambda r: r.iteration)
        self.scan.format = fmt
        self.scan.records = records


def _same_step_time(printed: float | None, measured: float | None) -> bool:
    """`Step Time : 9.09s` (2 decimals) belongs to `elapsed time per iteration (ms): 9089.0`."""
    if printed is None or measured is None:
        return True
    return abs(printed - measured) <= 0.006 + 0.002 * measured


def _segments(buf: bytes, start: int, end: int, markers: tuple[bytes, ...]):
    """(begin, end) of each line or progress-bar segment in buf[start:end] that holds a
    marker, in file order. Segments end at '\\n' or '\\r' (tqdm redraws with '\\r')."""
    hits = set()
    for marker in markers:
        pos = buf.find(marker, start, end)
        while pos >= 0:
            line_start = buf.rfind(b"\n", start, pos) + 1 or start
            line_start = max(line_start, start)
            cr = buf.rfind(b"\r", line_start, pos)
            seg_start = cr + 1 if cr >= 0 else line_start
            nl = buf.find(b"\n", pos, end)
            line_end = nl if nl >= 0 else end
            cr = buf.find(b"\r", pos, line_end)
            seg_end = cr if cr >= 0 else line_end
            hits.add((seg_start, seg_end))
            pos = buf.find(marker, seg_end, end)
    return sorted(hits)


def scan_log(path: str | Path, chunk_size: int = CHUNK_SIZE) -> LogScan:
    """Stream a log file once and return its step records; never holds the file whole."""
    scan = LogScan(Path(path))
    acc = _Accumulator(scan)

    def feed_region(buf: bytes, start: int, end: int) -> None:
        for seg_start, seg_end in _segments(buf, start, end, acc.markers()):
            acc.feed(buf[seg_start:seg_end], truncated=False)

    carry = b""  # the partial line at the end of the previous chunk
    with open(path, "rb") as fh:
        while True:
            data = fh.read(chunk_size)
            if not data:
                break
            scan.bytes_read += len(data)
            first = data.find(b"\n")
            if first < 0:
                carry += data
                if len(carry) > MAX_LINE:  # a runaway line: cut it at its last redraw
                    cut = carry.rfind(b"\r") + 1 or len(carry)
                    feed_region(carry, 0, cut)
                    carry = carry[cut:]
                continue
            # The line the chunk edge split is joined on its own; the rest of the chunk is
            # searched in place, so the chunk is never copied.
            head = carry + data[:first + 1]
            feed_region(head, 0, len(head))
            last = data.rfind(b"\n") + 1
            feed_region(data, first + 1, last)
            carry = data[last:]
    if carry:
        scan.truncated_last_line = True
        segments = _segments(carry, 0, len(carry), acc.markers())
        for seg_start, seg_end in segments:
            acc.feed(carry[seg_start:seg_end], truncated=seg_end == len(carry))
    acc.finish()
    return scan


# --- trainbench's metrics.jsonl ------------------------------------------------------------

def _number(value) -> float | None:
    """A JSON value as float; the engine writes NaN/inf as the strings 'nan'/'inf'."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def read_metrics_jsonl(path: str | Path) -> LogScan:
    """trainbench's metrics.jsonl (one StepMetrics object per line); a malformed or
    truncated line is skipped."""
    scan = LogScan(Path(path), format="trainbench")
    by_iteration: dict[int, StepRecord] = {}
    with open(path, "rb") as fh:
        for raw in fh:
            scan.bytes_read += len(raw)
            if not raw.endswith(b"\n"):
                scan.truncated_last_line = True
            try:
                data = json.loads(raw)
                iteration = int(data["iteration"])
            except (ValueError, KeyError, TypeError):
                continue
            rec = StepRecord(iteration)
            rec.total_iterations = _int_or_none(data.get("total_iterations"))
            for name in ("step_time_s", "tflops_per_gpu", "loss", "grad_norm"):
                setattr(rec, name, _number(data.get(name)))
            for name in _INT_FIELDS:
                setattr(rec, name, _int_or_none(data.get(name)))
            if rec.step_time_s is not None:
                by_iteration[iteration] = rec
    scan.records = sorted(by_iteration.values(), key=lambda r: r.iteration)
    if not scan.records:
        scan.format = None
    return scan


def _int_or_none(value) -> int | None:
    number = _number(value)
    return int(number) if number is not None and math.isfinite(number) else None


# --- the last error line -------------------------------------------------------------------

_ERROR_MARKERS = (b"Error", b"Exception", b"exception", b"error:", b"Traceback", b"Killed",
                  b"out of memory", b"CANCELLED")
# `RuntimeError: ...`, `srun: error: ...`, `torch.OutOfMemoryError: ...`: the line that says
# what went wrong, preferred over `Traceback (most recent call last):` and the like.
_STRONG_ERROR = re.compile(
    r"\b\w*(?:Error|Exception)\b:|\berror:|out of memory|CANCELLED|\bKilled\b")


def find_last_error(path: str | Path, chunk_size: int = CHUNK_SIZE) -> str | None:
    """The last error-looking line of a file (an exception message preferred over a bare
    `Traceback` line), read backwards from the end so a crash costs only the tail."""
    size = Path(path).stat().st_size
    weak: str | None = None
    with open(path, "rb") as fh:
        end = size
        tail = b""
        while end > 0:
            start = max(0, end - chunk_size)
            fh.seek(start)
            buf = fh.read(end - start) + tail
            # The first (partial) line of this block is completed by the next block back.
            newline = buf.find(b"\n")
            if start > 0 and newline < 0 and len(buf) <= MAX_LINE:
                tail, end = buf, start  # no line break yet: the whole block is one partial line
                continue
            cut = newline + 1 if start > 0 else 0
            lines = []
            for seg_start, seg_end in _segments(buf, cut, len(buf), _ERROR_MARKERS):
                lines.append(buf[seg_start:seg_end].decode("utf-8", "replace").strip())
            for line in reversed(lines):
                if not line or "train_step_timing" in line:
                    continue
                if _STRONG_ERROR.search(line):
                    return line[:500]
                weak = weak or line[:500]
            tail = buf[:cut]
            end = start
    return weak
