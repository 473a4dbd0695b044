"""Read training logs into step records. Pure Python, no torch.

Each log format is one small entry of a registry (`LogFormat` subclasses decorated with
`@register`): the byte markers of the lines it reads, a `read` method that turns one such
line into a step record or a fact, and, when it needs one, a `finish` step. The scanner
knows no format: it streams the file, finds marker hits, cuts the lines around them,
removes rank prefixes and hands each line to the formats whose markers it holds.

Logs with an NCCL trace reach several GB, almost all of it `NCCL INFO` lines, so a file
is read in large binary chunks and searched with `bytes.find` for the markers; only the
lines around a hit are decoded. Every format's step markers are searched until the first
step line names the format, only that format's after it. Facts (argument dumps, config
echoes, banners, profiler lines), which a run prints before training, are searched for in
the file's first HEAD_BYTES only, and profiler lines once more in its last TAIL_BYTES,
where nsys names its report. Iterations are 0-based everywhere (NeMo's `iteration 49/49` is the 50th step;
Megatron's 1-based `iteration 50/50` is stored as 49).

Adding a format: a module in results/formats/ with a LogFormat subclass (a name, a title,
its markers and a `read`) decorated with @register, named in formats/__init__.py; nothing
else changes. trainbench's own metrics.jsonl is read by metrics_jsonl.py, the line that
says why a run failed found by failure.py.
"""

from __future__ import annotations

import importlib
import math
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ..files import open_regular

CHUNK_SIZE = 16 * 2**20
# A line longer than this with no newline (a runaway progress bar) is cut here rather
# than held in memory whole.
MAX_LINE = 64 * 2**20
# What a format reads of one line or progress-bar segment: a step line is a few hundred
# bytes; the rest of a longer one is dropped (its cut field with it, as at a file's end).
MAX_SEGMENT = 64 * 2**10
# What read_metrics_jsonl reads of one line (a StepMetrics object is ~300 bytes).
MAX_JSONL_LINE = 2**20
# Iterations and run lengths past this are not a training run's (a trillion steps).
MAX_ITERATION = 10**12
# A run prints its settings (and its profiler its banner) before training: facts are
# looked for in the first bytes only, so a multi-GB NCCL trace is searched for step lines
# alone. Profilers announce their output files when the run ends (nsys's `Generated
# ...nsys-rep`): the last bytes are searched for them too.
HEAD_BYTES = 4 * 2**20
TAIL_BYTES = 8 * 2**20


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
    """The allocator's reserved peak (trainbench's metrics.jsonl; the framework's figure
    in another log)."""
    peak_allocated_bytes: int | None = None
    """The allocated peak (trainbench's metrics.jsonl on a GPU)."""
    memory_allocated_bytes: int | None = None
    consumed_samples: int | None = None
    global_batch_size: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def nonfinite_field(self) -> str | None:
        """'step_time_s', 'loss' or 'grad_norm' when that value is NaN or infinite (or a
        step time not above zero), else None."""
        if self.step_time_s is not None and not (math.isfinite(self.step_time_s)
                                                 and self.step_time_s > 0):
            return "step_time_s"
        for name in ("loss", "grad_norm"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                return name
        return None

    def merge(self, later: "StepRecord") -> None:
        """Fold in another print of the same step (another rank, a redraw, a second line):
        its values win, except that the peak memory is the largest any rank reports and a
        NaN or infinite step time, loss or gradient norm on any rank is kept."""
        for f in fields(self):
            new, old = getattr(later, f.name), getattr(self, f.name)
            if new is None or f.name == "iteration":
                continue
            if old is not None and f.name in ("peak_memory_bytes", "memory_allocated_bytes"):
                new = max(old, new)
            elif (old is not None and f.name in ("loss", "grad_norm", "step_time_s")
                  and not math.isfinite(old)):
                new = old
            setattr(self, f.name, new)


@dataclass
class LogScan:
    """What one pass over a log file found."""

    path: Path
    format: str | None = None
    """A registered format's name (or 'trainbench' for metrics.jsonl); None when no step
    line was found."""
    records: list[StepRecord] = field(default_factory=list)
    """Step records with a step time, sorted by iteration, one per iteration (every print
    of one step merged: a redrawn progress bar or eight ranks printing count once)."""
    config: dict[str, str] = field(default_factory=dict)
    """Run settings as the log prints them (MaxText's `Config param steps: 50`)."""
    facts: dict[str, int | str] = field(default_factory=dict)
    """What the log states about the run, normalised: world_size, seq_len, gbs, tp, pp,
    cp, ep, total_iterations, dtype. The user's options override them."""
    families: set[str] = field(default_factory=set)
    """Formats whose banner lines appeared (a NeMo run that crashed before its first step
    is still a NeMo log, not an unknown one)."""
    profiled: str | None = None
    """The log line that shows the run was profiled (nsys, torch profiler, xprof)."""
    notes: list[str] = field(default_factory=list)
    """How the records were obtained where the log made it unusual."""
    step_like_lines: int = 0
    """Lines that look like a training step in a format no entry reads (a loss and a
    step or iteration number): such a file is an unrecognised training log."""
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
        total = self.facts.get("total_iterations")
        return int(total) if isinstance(total, int) and total > 0 else None

    @property
    def recognised(self) -> bool:
        """A format trainbench reads, even if no step line made it through."""
        return self.format is not None or bool(self.families)


# --- numbers and key/value pairs ---------------------------------------------------------

# NeMo 1 progress bars print a NaN as `nan.0`; the `.0` belongs to the number.
_NUM = (r"[-+]?(?:nan(?:\.0*)?|inf(?:inity)?(?:\.0*)?|"
        r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)")
# `key: value` (NeMo 2, Megatron, MaxText) or `key=value` (NeMo 1 progress bars). Keys
# may hold spaces, parentheses and slashes: `elapsed time per iteration (ms): 20289.1`.
# A key is found backwards from its separator (key_values), never by a lazy pattern tried
# at every letter: that costs time quadratic in a run of key characters with no `:` or `=`.
_PAIR = re.compile(r"[:=]\s*(" + _NUM + r")(?![\w.])", re.I)
_NOT_KEY = re.compile(r"[^\w ()/.\-]", re.I)
_KEY_START = re.compile(r"[A-Za-z_]", re.I)
_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)")


def number(text: str) -> float:
    """float() that also reads `nan.0` and `-inf.0`."""
    core = text.lower().lstrip("+-")
    if core.startswith("nan"):
        return math.nan
    if core.startswith("inf"):
        return -math.inf if text.startswith("-") else math.inf
    return float(text)


def key_values(text: str) -> dict[str, float]:
    """Every `key: number` / `key=number` pair of a line, keys normalised.

    The key of a pair is the run of key characters (letters, digits, `_`, spaces,
    `()/.-`) that ends at its separator, from its first letter or `_`. Each separator
    followed by a number is found once, and its key is looked for only between it and the
    separator before, so a line costs time linear in its length whatever it holds."""
    out = {}
    floor = 0  # where the next key may start: after the previous separator or pair
    for pair in _PAIR.finditer(text):
        sep = pair.start()
        begin, floor = floor, sep + 1
        key_end = begin + len(text[begin:sep].rstrip())
        run = begin
        for other in _NOT_KEY.finditer(text, begin, key_end):
            run = other.end()
        start = _KEY_START.search(text, run, key_end)
        if start is None:
            continue
        out[" ".join(text[start.start():key_end].lower().split())] = number(pair.group(1))
        floor = pair.end()
    return out


_INT_FIELDS = {"peak_memory_bytes", "peak_allocated_bytes", "memory_allocated_bytes",
               "consumed_samples", "global_batch_size"}


def fill(rec: StepRecord, pairs: dict[str, float],
         keys: dict[str, tuple[str, float]]) -> None:
    """Set the record's fields from a line's pairs through a format's key table
    (normalised key -> (StepRecord field, scale))."""
    for key, value in pairs.items():
        target = keys.get(key)
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


# --- rank prefixes and glued lines ---------------------------------------------------------

# What launchers put before a rank's line: torchrun's `[rank3]:` and `[default7]:`, srun -l's
# `1: `, glog's `I0811 21:54:55.531340 138304841739136 metric_logger.py:226] `.
_PREFIX = re.compile(
    r"^(?:\s*(?:\[(?:rank|default)\d+\]:|\d+:(?=\s)|"
    r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+\s+[\w.\-]+:\d+\]))*\s*")
# Two ranks writing at once glue their lines: `...max reserved: 26880.0[Rank 1] (after ...`.
_GLUE = re.compile(r"(?<=\S)(?=\[(?:Rank \d+\]|rank\d+\]:|default\d+\]:))")


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def split_ranks(text: str) -> list[str]:
    """A line cut into one piece per rank, each without colour codes or launcher prefix."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return [_PREFIX.sub("", piece, count=1) for piece in _GLUE.split(text)]


# --- facts every format may state -------------------------------------------------------

PROFILER_MARKERS = (
    b"nsys profile", b".nsys-rep", b".qdrep", b".qdstrm",        # Nsight Systems
    b"Dumping profiler traces", b"Profiling active",             # torchtitan's torch profiler
    b"torch.profiler", b"Profiler session started",              # torch profiler, xprof
)


class ScanState:
    """What the formats write into while the scanner feeds them lines in file order."""

    def __init__(self, scan: LogScan):
        self.scan = scan
        self.records: dict[str, dict[int, StepRecord]] = {}
        self.detected: str | None = None
        self.out_of_range = 0
        """Step lines whose iteration lies outside 0..MAX_ITERATION (left out)."""

    def step(self, fmt: str, rec: StepRecord | None, detect: bool = True) -> StepRecord | None:
        """Store a record (merged with an earlier print of its step); the first one with
        a step time names the file's format."""
        if rec is None:
            return None
        if not 0 <= rec.iteration <= MAX_ITERATION:
            self.out_of_range += 1
            return None
        if rec.total_iterations is not None and not 0 < rec.total_iterations <= MAX_ITERATION:
            rec.total_iterations = None
        records = self.records.setdefault(fmt, {})
        old = records.get(rec.iteration)
        if old is not None:
            old.merge(rec)
            rec = old
        else:
            records[rec.iteration] = rec
        if detect and self.detected is None and rec.step_time_s is not None:
            self.detected = fmt
        return rec

    def fact(self, key: str, value: int | str | None) -> None:
        if isinstance(value, int) and not 0 <= value <= MAX_ITERATION:
            return  # no world size, batch or run length is that large
        if value is not None and value != "":
            self.scan.facts[key] = value

    def profiled(self, line: str) -> None:
        if self.scan.profiled is None:
            self.scan.profiled = line.strip()[:200]

    def peak_memory(self, value_bytes: int) -> None:
        self.scan.peak_memory_bytes = max(self.scan.peak_memory_bytes or 0, value_bytes)


def read_profiler_line(text: str, state: ScanState) -> None:
    for marker in PROFILER_MARKERS:
        if marker.decode() in text:
            state.profiled(text)
            return


# --- the registry ------------------------------------------------------------------------

class LogFormat:
    """One log format. Subclass it, set the class attributes, write `read`, and decorate
    the class with @register."""

    name: str = ""
    title: str = ""
    """How the README and `results` name it."""
    markers: tuple[bytes, ...] = ()
    """Substrings of the lines `read` wants, searched through the whole file (its step
    lines). Keep them few and long: each one is a pass over every byte."""
    head_markers: tuple[bytes, ...] = ()
    """Substrings of the lines `read_head` wants (facts: argument dumps, config echoes),
    searched in the first HEAD_BYTES of the file, where a run prints its settings."""
    banners: tuple[bytes, ...] = ()
    """Substrings only this framework prints near the start: a log with one is this
    framework's even if it crashed before its first step."""

    def read(self, text: str, state: ScanState) -> None:
        """Read one line (rank prefix removed) holding one of `markers`."""
        raise NotImplementedError

    def read_head(self, text: str, state: ScanState) -> None:
        """Read one line of the file's head holding one of `head_markers`."""

    def finish(self, state: ScanState) -> None:
        """After the last line: fix what only the whole log tells."""


REGISTRY: dict[str, LogFormat] = {}


def register(cls: type[LogFormat]) -> type[LogFormat]:
    REGISTRY[cls.name] = cls()
    return cls


def load_formats() -> dict[str, LogFormat]:
    """The registry, once results.formats (whose modules register themselves) is loaded:
    imported on first use, so the formats import this module and not the other way."""
    importlib.import_module(f"{__package__}.formats")
    return REGISTRY


def formats_read() -> str:
    """'NeMo 2, NeMo 1, ...': the formats trainbench reads, for messages."""
    return ", ".join(["trainbench"] + [f.title for f in load_formats().values()])


def int_fact(value: str) -> int | None:
    """A fact's integer as a log prints it (`8`, `8.0`); None for what is none."""
    try:
        return int(float(value))
    except (ValueError, OverflowError):  # 'inf', or more digits than a float holds
        return None


# --- the streaming scanner ---------------------------------------------------------------

class _Dispatcher:
    """Hands each marker line to the formats that asked for it."""

    def __init__(self, scan: LogScan):
        self.scan = scan
        self.state = ScanState(scan)
        # Fresh instances: a format may keep state while it reads one file.
        self.formats = {name: type(fmt)() for name, fmt in load_formats().items()}
        self.strings = {name: ([m.decode() for m in f.markers],
                               [m.decode() for m in f.head_markers],
                               [m.decode() for m in f.banners])
                        for name, f in self.formats.items()}
        self._steps = tuple(dict.fromkeys(m for f in self.formats.values() for m in f.markers))
        self.head_markers = tuple(dict.fromkeys(
            m for f in self.formats.values() for m in f.head_markers + f.banners)
            ) + PROFILER_MARKERS

    def markers(self) -> tuple[bytes, ...]:
        if self.state.detected is None:
            return self._steps
        return self.formats[self.state.detected].markers

    def feed(self, raw: bytes, truncated: bool) -> None:
        text = _line_text(raw, truncated)
        detected = self.state.detected
        for piece in split_ranks(text):
            for name, fmt in self.formats.items():
                if detected is not None and name != detected:
                    continue
                if any(m in piece for m in self.strings[name][0]):
                    self._guarded(fmt.read, piece)

    def feed_head(self, raw: bytes) -> None:
        """A line of the file's head: facts, banners, profiler lines."""
        for piece in split_ranks(_line_text(raw, False)):
            for name, fmt in self.formats.items():
                _, head, banners = self.strings[name]
                if any(m in piece for m in banners):
                    self.scan.families.add(name)
                if any(m in piece for m in head):
                    self._guarded(fmt.read_head, piece)
            read_profiler_line(piece, self.state)

    def _guarded(self, read, piece: str) -> None:
        """A value beyond its type's range (an integer of 5,000 digits, which int() refuses;
        a float overflow) leaves its line out, counted, instead of ending the scan."""
        try:
            read(piece, self.state)
        except (ValueError, OverflowError):
            self.state.out_of_range += 1

    def finish(self) -> None:
        for fmt in self.formats.values():
            fmt.finish(self.state)
        if self.state.out_of_range:
            self.scan.notes.append(f"{self.state.out_of_range} step line(s) with an iteration "
                                   "or value out of range left out")
        by_format = self.state.records
        candidates = {k: v for k, v in by_format.items()
                      if any(r.step_time_s is not None for r in v.values())}
        if not candidates:
            self.scan.notes.clear()
            return
        # A file holds one run; should two formats appear, the one with most steps wins.
        fmt = self.state.detected if self.state.detected in candidates else max(
            candidates, key=lambda k: len(candidates[k]))
        records = [r for r in candidates[fmt].values() if r.step_time_s is not None]
        records.sort(key=lambda r: r.iteration)
        self.scan.format = fmt
        self.scan.records = records
        self.scan.families.add(fmt)


def _line_text(raw: bytes, truncated: bool) -> str:
    """A segment as the formats read it, decoded: a line the file ended in the middle of
    loses its last field (_cut_truncated); a line longer than MAX_SEGMENT is cut there and
    loses the word the cut split (a step line's fields come first, and a 2 MB line costs no
    more than its first 64 KiB)."""
    if len(raw) > MAX_SEGMENT:
        text = raw[:MAX_SEGMENT].decode("utf-8", "replace")
        return text[:max(text.rfind(c) for c in " \t|,]") + 1]
    text = raw.decode("utf-8", "replace")
    return _cut_truncated(text) if truncated else text


def _cut(buf: bytes, begin: int, end: int) -> bytes:
    """buf[begin:end], at most one byte past MAX_SEGMENT (so _line_text still sees that it
    was cut): a 64 MB segment is never copied whole."""
    return buf[begin:min(end, begin + MAX_SEGMENT + 1)]


def _segments(buf: bytes, start: int, end: int, markers: tuple[bytes, ...]):
    """(begin, end) of each line or progress-bar segment in buf[start:end] that holds a
    marker, in file order. Segments end at '\\n' or '\\r' (tqdm redraws with '\\r').

    Every search resumes where the previous one for the same marker stopped (the start of
    a segment is looked for back to the end of the last one, its end forward from a
    cached next line break), so a line of a million redraws costs one pass per marker,
    not one per redraw."""
    hits = set()
    for marker in markers:
        floor = start  # the end of the previous segment: no segment starts before it
        next_nl = next_cr = start - 1  # the next b"\n" / b"\r" at or after a hit; end: none
        pos = buf.find(marker, start, end)
        while pos >= 0:
            back = max(buf.rfind(b"\n", floor, pos), buf.rfind(b"\r", floor, pos))
            seg_start = back + 1 if back >= 0 else floor
            if next_nl < pos:
                found = buf.find(b"\n", pos, end)
                next_nl = found if found >= 0 else end
            if next_cr < pos:
                found = buf.find(b"\r", pos, next_nl)
                next_cr = found if found >= 0 else next_nl
            seg_end = min(next_nl, next_cr)
            hits.add((seg_start, seg_end))
            floor = seg_end
            pos = buf.find(marker, seg_end, end)
    return sorted(hits)


def scan_log(path: str | Path, chunk_size: int = CHUNK_SIZE) -> LogScan:
    """Stream a log file and return its step records and facts; never holds the file
    whole. The head and the tail (HEAD_BYTES, TAIL_BYTES) are read once more for facts.
    files.NotRegularFile for a FIFO, device, socket or directory: never read."""
    scan = LogScan(Path(path))
    acc = _Dispatcher(scan)
    with open_regular(path) as fh:
        _edge(fh, 0, HEAD_BYTES, acc.head_markers, acc.feed_head)
        fh.seek(0)
        _stream(fh, scan, acc, chunk_size)
        size = scan.bytes_read
        if scan.profiled is None and size > HEAD_BYTES:
            _edge(fh, max(HEAD_BYTES, size - TAIL_BYTES), size, PROFILER_MARKERS,
                  lambda raw: read_profiler_line(raw.decode("utf-8", "replace"), acc.state))
        acc.finish()
        if not scan.recognised:
            _count_step_like(fh, scan, chunk_size)
    return scan


def _edge(fh, start: int, end: int, markers: tuple[bytes, ...], feed) -> None:
    """Feed the whole lines of bytes start..end holding a marker (a partial first line
    is skipped: the part before start holds its beginning)."""
    fh.seek(start)
    buf = fh.read(end - start)
    begin = buf.find(b"\n") + 1 if start > 0 else 0
    stop = len(buf) if len(buf) < end - start else buf.rfind(b"\n") + 1
    for seg_start, seg_end in _segments(buf, begin, stop, markers):
        feed(_cut(buf, seg_start, seg_end))


def _stream(fh, scan: LogScan, acc: _Dispatcher, chunk_size: int) -> None:
    def feed_region(buf: bytes, start: int, end: int) -> None:
        for seg_start, seg_end in _segments(buf, start, end, acc.markers()):
            acc.feed(_cut(buf, seg_start, seg_end), truncated=False)

    carry = b""  # the partial line at the end of the previous chunk
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
        for seg_start, seg_end in _segments(carry, 0, len(carry), acc.markers()):
            acc.feed(_cut(carry, seg_start, seg_end), truncated=seg_end == len(carry))


def _count_step_like(fh, scan: LogScan, chunk_size: int, limit: int = 64 * 2**20) -> None:
    """Lines of an unknown format that look like training steps (a loss and a step or
    iteration count), in the first `limit` bytes."""
    fh.seek(0)
    buf = fh.read(limit)
    for seg_start, seg_end in _segments(buf, 0, len(buf), (b"oss",)):
        low = _cut(buf, seg_start, seg_end).decode("utf-8", "replace").lower()
        if "loss" in low and ("step" in low or "iter" in low):
            scan.step_like_lines += 1
