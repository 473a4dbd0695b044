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

Adding a format: subclass LogFormat, give it a name, a title, its markers and a `read`,
decorate it with @register; nothing else changes.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
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


_INT_FIELDS = {"peak_memory_bytes", "memory_allocated_bytes", "consumed_samples",
               "global_batch_size"}


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


def formats_read() -> str:
    """'NeMo 2, NeMo 1, ...': the formats trainbench reads, for messages."""
    return ", ".join(["trainbench"] + [f.title for f in REGISTRY.values()])


def _int_fact(value: str) -> int | None:
    try:
        return int(float(value))
    except (ValueError, OverflowError):  # 'inf', or more digits than a float holds
        return None


# NeMo's config echo (NeMo 1's Hydra YAML, NeMo 2's recipe printout): `  devices: 8`,
# `tensor_model_parallel_size=8,`.
_NEMO_CONFIG = {
    "devices": "devices", "num_nodes": "num_nodes", "max_steps": "total_iterations",
    "global_batch_size": "gbs", "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp", "context_parallel_size": "cp",
    "expert_model_parallel_size": "ep", "encoder_seq_length": "seq_len",
    "seq_length": "seq_len",
}
_NEMO_CONFIG_LINE = re.compile(r"(?:^|[\s(,])(" + "|".join(_NEMO_CONFIG) + r")\s*[:=]\s*(\d+)\b")


def _read_nemo_config(text: str, state: ScanState) -> None:
    for key, value in _NEMO_CONFIG_LINE.findall(text):
        state.fact("_" + _NEMO_CONFIG[key] if key in ("devices", "num_nodes")
                   else _NEMO_CONFIG[key], int(value))
    facts = state.scan.facts
    if "_devices" in facts:
        state.fact("world_size", int(facts["_devices"]) * int(facts.get("_num_nodes", 1)))


_NEMO_KEYS: dict[str, tuple[str, float]] = {
    "train_step_timing in s": ("step_time_s", 1.0),
    "tflops_per_gpu": ("tflops_per_gpu", 1.0),
    "reduced_train_loss": ("loss", 1.0),
    "grad_norm": ("grad_norm", 1.0),
    "peak_memory_usage": ("peak_memory_bytes", 1.0),
    "max_memory_reserved": ("peak_memory_bytes", 1.0),
    "memory_allocated": ("memory_allocated_bytes", 1.0),
    "max_memory_allocated": ("memory_allocated_bytes", 1.0),
    "consumed_samples": ("consumed_samples", 1.0),
    "global_batch_size": ("global_batch_size", 1.0),
}
_NEMO_HEAD = (b"parallel_size", b"global_batch_size", b"seq_length", b"max_steps",
              b"num_nodes", b"devices")


def parse_nemo2_line(text: str) -> StepRecord | None:
    """`Training epoch 0, iteration 49/49 | ... | train_step_timing in s: 12.39 | ...`
    (also trainbench's own log line, which adds grad_norm and TFLOPS_per_GPU). The step
    is the global step: `iteration` restarts every epoch, `global_step` does not."""
    pairs = key_values(text)
    match = _ITERATION.search(text)
    step = pairs.get("global_step")
    if step is not None and not (math.isfinite(step) and step == int(step)):
        step = None
    if match:
        iteration, last = int(match.group(1)), int(match.group(2))
        if step is not None and int(step) != iteration:
            rec = StepRecord(int(step))  # a later epoch: `/N` counts this epoch only
        else:
            rec = StepRecord(iteration, last + 1)
    elif step is not None:
        rec = StepRecord(int(step))
    else:
        return None
    fill(rec, pairs, _NEMO_KEYS)
    return rec


@register
class NeMo2(LogFormat):
    name = "nemo2"
    title = "NeMo 2"
    # NeMo 1 and 2 share the search: one pass over the file finds both.
    markers = (b"train_step_timing in s",)
    head_markers = _NEMO_HEAD
    banners = (b"[NeMo ",)

    def __init__(self):
        self.epochs = False

    def read(self, text, state):
        if "train_step_timing in s:" in text:
            rec = state.step(self.name, parse_nemo2_line(text))
            if rec is not None and rec.total_iterations is None and _ITERATION.search(text):
                self.epochs = True

    def read_head(self, text, state):
        _read_nemo_config(text, state)

    def finish(self, state):
        records = state.records.get(self.name, {})
        if self.epochs:
            # More than one epoch: `iteration i/N` counts one epoch, not the run.
            for rec in records.values():
                rec.total_iterations = None
            if records:
                state.scan.notes.append("more than one epoch: steps keyed on global_step")


# (?<!\d): a match starts at the first digit of a run, so a long run costs one scan.
_PROGRESS = re.compile(r"(?<!\d)(\d+)/(\d+|\?)\s*\[")


def parse_nemo1_segment(text: str) -> StepRecord | None:
    """One NeMo 1 progress-bar update:
    `Epoch 0: : 100%|...| 100/100 [07:57<00:00, reduced_train_loss=7.310, global_step=99.00,
    consumed_samples=25600.0, train_step_timing in s=3.590]`.
    Lightning rounds `global_step` to three significant digits past 1000 (`3.2e+4`); the
    bar's own count then gives the step exactly."""
    pairs = key_values(text)
    step = pairs.get("global_step")
    if step is None or not math.isfinite(step):
        return None
    progress = _PROGRESS.search(text)
    total = None
    if progress and progress.group(2) != "?":
        total = int(progress.group(2))
    iteration = int(step)
    if re.search(r"global_step=[\d.]+e", text, re.I) and progress:
        iteration = int(progress.group(1)) - 1
    rec = StepRecord(iteration, total)
    # `loss=` in the bar is Lightning's running mean, not the step's loss.
    pairs.pop("loss", None)
    fill(rec, pairs, _NEMO_KEYS | {"train_step_timing in s": ("step_time_s", 1.0)})
    return rec


@register
class NeMo1(LogFormat):
    name = "nemo1"
    title = "NeMo 1 (progress bars)"
    markers = NeMo2.markers
    head_markers = _NEMO_HEAD
    banners = NeMo2.banners

    def read(self, text, state):
        if "train_step_timing in s=" in text:
            state.step(self.name, parse_nemo1_segment(text))

    def read_head(self, text, state):
        _read_nemo_config(text, state)


# --- Megatron-LM, Megatron-Bridge, Megatron-DeepSpeed --------------------------------------

_MEGATRON_KEYS: dict[str, tuple[str, float]] = {
    "elapsed time per iteration (ms)": ("step_time_s", 1e-3),
    "elapsed time per iteration (s)": ("step_time_s", 1.0),
    "throughput per gpu (tflop/s/gpu)": ("tflops_per_gpu", 1.0),
    "tflops": ("tflops_per_gpu", 1.0),
    "lm loss": ("loss", 1.0),
    "grad norm": ("grad_norm", 1.0),
    "consumed samples": ("consumed_samples", 1.0),
    "global batch size": ("global_batch_size", 1.0),
}
_TFLOPS_AFTER_UNIT = re.compile(r"TFLOP/s/GPU\)?\s*:\s*(" + _NUM + ")", re.I)
_TFLOPS_BEFORE_UNIT = re.compile(r"(?<![\d.])(\d+(?:\.\d*)?)\s*(?:MODEL_)?TFLOP/s/GPU")
_BRIDGE_STEP_TIME = re.compile(r"Step Time\s*:\s*(\d+(?:\.\d*)?)\s*s")
# `  tensor_model_parallel_size ...................... 8`
_ARGUMENT = re.compile(r"^\s*(\w+) \.{2,} (\S+)\s*$")
_MEGATRON_ARGS = {
    "world_size": "world_size", "seq_length": "seq_len", "global_batch_size": "gbs",
    "tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp",
    "context_parallel_size": "cp", "expert_model_parallel_size": "ep",
    "train_iters": "total_iterations", "log_interval": "log_interval",
}


def parse_megatron_line(text: str) -> StepRecord | None:
    """`iteration   12/  50 | consumed samples: ... | elapsed time per iteration (ms):
    20289.1 | ... | lm loss: ... | grad norm: ...` (1-based iteration, stored 0-based;
    Megatron-DeepSpeed prints `elapsed time per iteration (s)`)."""
    match = _ITERATION.search(text)
    if not match:
        return None
    rec = StepRecord(int(match.group(1)) - 1, int(match.group(2)))
    fill(rec, key_values(text), _MEGATRON_KEYS)
    if rec.tflops_per_gpu is None:
        rec.tflops_per_gpu = megatron_tflops(text)
    return rec


def megatron_tflops(text: str) -> float | None:
    """TFLOPS from `... 663.5MODEL_TFLOP/s/GPU` or `throughput per GPU (TFLOP/s/GPU): 420.1`."""
    match = _TFLOPS_AFTER_UNIT.search(text) or _TFLOPS_BEFORE_UNIT.search(text)
    return float(match.group(1)) if match else None


def _read_megatron_common(text: str, state: ScanState) -> bool:
    """The argument dump and the memory report, printed by every Megatron flavour."""
    if "memory (MB)" in text:
        pairs = key_values(text)
        peak = pairs.get("max reserved", pairs.get("max allocated"))
        if peak is not None and math.isfinite(peak):
            state.peak_memory(int(peak * 2**20))
        return True
    match = _ARGUMENT.match(text)
    if match:
        key, value = match.groups()
        if key in _MEGATRON_ARGS:
            state.fact(_MEGATRON_ARGS[key], _int_fact(value))
        elif key in ("bf16", "fp16", "fp8") and value not in ("False", "None"):
            state.fact("dtype", "fp8" if key == "fp8" else key)
        elif key in ("profile", "use_pytorch_profiler") and value == "True":
            state.profiled(text)
        return True
    return False


def _same_step_time(printed: float | None, measured: float | None) -> bool:
    """`Step Time : 9.09s` (2 decimals) belongs to `elapsed time per iteration (ms): 9089.0`."""
    if printed is None or measured is None:
        return True
    return abs(printed - measured) <= 0.006 + 0.002 * measured


@register
class Megatron(LogFormat):
    """Megatron-LM and Megatron-Bridge. Bridge prints `Step Time : 9.09s GPU utilization:
    663.5MODEL_TFLOP/s/GPU` on its own line next to the iteration line (matched to its
    iteration by step time, whichever comes first); a log of rank 0 alone may hold only
    those lines, counted then at the log interval."""

    name = "megatron"
    title = "Megatron-LM / Megatron-Bridge"
    # Megatron-DeepSpeed's `(s)` lines share the search; each flavour reads its own.
    markers = (b"elapsed time per iteration (", b"TFLOP/s/GPU", b"memory (MB)")
    head_markers = (b".. ",)
    banners = (b"------------------------ arguments ------------------------",
               b"> building ", b"megatron.core", b"megatron.bridge")

    def __init__(self):
        self.pending_tflops: tuple[float, float | None] | None = None
        self.last: StepRecord | None = None
        self.step_times: list[tuple[float, float | None]] = []

    def read(self, text, state):
        if "elapsed time per iteration (ms)" in text or (
                "TFLOP/s/GPU" in text and _ITERATION.search(text)):
            self._iteration(text, state)
        elif "TFLOP/s/GPU" in text:
            self._tflops_line(text, state)
        elif "elapsed time per iteration (s)" not in text:
            _read_megatron_common(text, state)

    def read_head(self, text, state):
        _read_megatron_common(text, state)

    def _iteration(self, text, state):
        rec = parse_megatron_line(text)
        if rec is None:
            return
        if rec.tflops_per_gpu is None and self.pending_tflops is not None:
            value, step_time = self.pending_tflops
            if _same_step_time(step_time, rec.step_time_s):
                rec.tflops_per_gpu = value
        self.pending_tflops = None
        self.last = state.step(self.name, rec)

    def _tflops_line(self, text, state):
        value = megatron_tflops(text)
        if value is None:
            return
        match = _BRIDGE_STEP_TIME.search(text)
        step_time = float(match.group(1)) if match else None
        if step_time is not None:
            self.step_times.append((step_time, value))
            if state.detected is None:
                state.detected = self.name
        last = self.last
        if (last is not None and last.tflops_per_gpu is None
                and _same_step_time(step_time, last.step_time_s)):
            last.tflops_per_gpu = value
        else:
            self.pending_tflops = (value, step_time)

    def finish(self, state):
        if state.records.get(self.name) or not self.step_times:
            return
        interval = int(state.scan.facts.get("log_interval", 1) or 1)
        total = state.scan.facts.get("total_iterations")
        for k, (step_time, tflops) in enumerate(self.step_times):
            rec = StepRecord((k + 1) * interval - 1, total if isinstance(total, int) else None,
                             step_time_s=step_time, tflops_per_gpu=tflops)
            state.step(self.name, rec)
        state.scan.notes.append(f"no iteration lines: {len(self.step_times)} `Step Time` lines "
                                f"taken as every {interval} iteration(s) from the first")


@register
class MegatronDeepSpeed(LogFormat):
    """`iteration 12695/ 115311 | ... | elapsed time per iteration (s): 105.22 | ... |
    TFLOPs: 149.02 |`: seconds, not milliseconds."""

    name = "megatron-deepspeed"
    title = "Megatron-DeepSpeed"
    markers = (b"elapsed time per iteration (", b"memory (MB)")
    head_markers = (b".. ",)
    banners = (b"DeepSpeed general environment info", b"deepspeed_config")

    def read(self, text, state):
        if "elapsed time per iteration (s)" in text:
            state.step(self.name, parse_megatron_line(text))
        elif "memory (MB)" in text:
            _read_megatron_common(text, state)

    def read_head(self, text, state):
        _read_megatron_common(text, state)


# --- MaxText --------------------------------------------------------------------------------

_MAXTEXT_STEP = re.compile(r"completed step:\s*(\d+)")
_MAXTEXT_CONFIG = re.compile(r"Config param (\w+): (\S*)")
_MAXTEXT_DEVICES = re.compile(r"Num_devices:\s*(\d+)")
_MAXTEXT_FACTS = {"steps": "total_iterations", "max_target_length": "seq_len",
                  "global_batch_size_to_train_on": "gbs", "ici_tensor_parallelism": "tp",
                  "ici_pipeline_parallelism": "pp", "ici_context_parallelism": "cp"}
_MAXTEXT_DTYPES = {"bfloat16": "bf16", "float32": "fp32"}
_MAXTEXT_KEYS: dict[str, tuple[str, float]] = {
    "seconds": ("step_time_s", 1.0),
    "tflop/s/device": ("tflops_per_gpu", 1.0),
    "loss": ("loss", 1.0),
}


def parse_maxtext_line(text: str) -> StepRecord | None:
    """`completed step: 49, seconds: 7.908, TFLOP/s/device: 460.480, Tokens/s/device:
    1035.970, total_weights: 524288, loss: 0.000` (0-based steps; no total printed)."""
    match = _MAXTEXT_STEP.search(text)
    if not match:
        return None
    rec = StepRecord(int(match.group(1)))
    fill(rec, key_values(text), _MAXTEXT_KEYS)
    return rec


@register
class MaxText(LogFormat):
    name = "maxtext"
    title = "MaxText"
    markers = (b"completed step:",)
    head_markers = (b"Config param ", b"Num_devices")
    banners = (b"Config param ", b"maxtext", b"MaxText")

    def read(self, text, state):
        state.step(self.name, parse_maxtext_line(text))

    def read_head(self, text, state):
        if match := _MAXTEXT_DEVICES.search(text):
            state.fact("world_size", int(match.group(1)))
        elif match := _MAXTEXT_CONFIG.search(text):
            key, value = match.groups()
            state.scan.config[key] = value
            if key in _MAXTEXT_FACTS:
                state.fact(_MAXTEXT_FACTS[key], _int_fact(value))
            elif key == "dtype" and value in _MAXTEXT_DTYPES:
                state.scan.facts.setdefault("dtype", _MAXTEXT_DTYPES[value])
            elif key == "quantization" and "fp8" in value:
                state.fact("dtype", "fp8")
            elif key == "profiler" and value not in ("", "none", "None", "''"):
                state.profiled(text)


# --- torchtitan -----------------------------------------------------------------------------

# torchtitan/components/metrics.py, MetricsProcessor.log:
#   f"step: {step:2}  loss: {loss:7.4f}  grad_norm: {grad_norm:7.4f}  "
#   f"memory: {max_reserved_gib:5.2f}GiB({max_reserved_pct:.2f}%)  tps: {round(tps):,}  "
#   f"tflops: {tflops:,.2f}  mfu: {mfu:.2f}%"
# (older releases print no grad_norm); its validator prints `validate step: ...`, which
# is no training step.
_TITAN_STEP = re.compile(r"(?<!validate )\bstep:\s*(\d+)\s+loss:\s*(" + _NUM + r")")
_TITAN_TIME = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")
_TITAN_FIELDS = re.compile(
    r"grad_norm:\s*(?P<grad>" + _NUM + r")|memory:\s*(?P<mem>[\d.]+)GiB"
    r"|tflops:\s*(?P<tflops>\d[\d,]*(?:\.\d+)?)")
# torchtitan/train.py, Trainer.train: `Training starts at step {self.step + 1}` (with the
# batch sizes and run length in older releases), printed just before the first step.
_TITAN_START_STEP = re.compile(r"Training starts at step (\d+)")
_TITAN_START = re.compile(
    r"Training starts at step \d+, with local batch size (\d+), global batch size (\d+), "
    r"sequence length (\d+), total steps (\d+)")
_TITAN_MESH = re.compile(r"device mesh with \[[^\]]*\], \[([\d, ]+)\]")


def _titan_stamp(text: str) -> datetime | None:
    stamp = _TITAN_TIME.search(text)
    if stamp is None:
        return None
    try:
        when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")
    except ValueError:  # 2026-13-45: not a time
        return None
    return when.replace(microsecond=int(stamp.group(2)) * 1000)


@register
class TorchTitan(LogFormat):
    """`[rank0]:[titan] 2025-06-16 22:30:50,322 - root - INFO - step: 200  loss:  6.1384
    memory: 49.66GiB(52.28%)  tps: 5,856  tflops: 339.16  mfu: 34.29%`, every rank
    printing, at step 1 and every `log_freq` steps. No step time is printed: it is the
    time between two logged steps (the interval torchtitan's own tps and mfu are measured
    over) divided by the steps between them. The first logged step is timed from the
    `Training starts at step N` line printed just before it (so a log of steps 1-10 has
    ten timed steps); in an excerpt without that line it has no time, and a note says so."""

    name = "torchtitan"
    title = "torchtitan"
    markers = (b"GiB(",)
    head_markers = (b"Training starts at step", b"device mesh with")
    banners = (b"[titan]",)

    def __init__(self):
        self.stamps: dict[int, datetime] = {}
        self.order: list[int] = []  # the stamped iterations, sorted
        self.start: tuple[int, datetime] | None = None
        """(0-based iteration of the first step, when `Training starts` was printed)."""
        self.untimed: int | None = None

    def read_head(self, text, state):
        if match := _TITAN_START.search(text):
            state.fact("gbs", int(match.group(2)))
            state.fact("seq_len", int(match.group(3)))
            state.fact("total_iterations", int(match.group(4)))
        elif match := _TITAN_MESH.search(text):
            state.fact("world_size", math.prod(int(d) for d in match.group(1).split(",")))
        elif "Profiling active" in text:
            state.profiled(text)
        if self.start is None and (match := _TITAN_START_STEP.search(text)):
            when = _titan_stamp(text)
            if when is not None:
                self.start = (int(match.group(1)) - 1, when)

    def read(self, text, state):
        step = _TITAN_STEP.search(text)
        if step is None:
            return
        # torchtitan counts steps from 1.
        rec = StepRecord(int(step.group(1)) - 1, loss=number(step.group(2)))
        for match in _TITAN_FIELDS.finditer(text):
            if match.group("grad"):
                rec.grad_norm = number(match.group("grad"))
            elif match.group("mem"):
                rec.peak_memory_bytes = int(float(match.group("mem")) * 2**30)
            elif match.group("tflops"):
                rec.tflops_per_gpu = float(match.group("tflops").replace(",", ""))
        when = _titan_stamp(text)
        if when is not None and rec.iteration not in self.stamps:
            self._time(rec, when)
        # Every rank prints the step; any of them names the format.
        state.step(self.name, rec)
        if state.detected is None:
            state.detected = self.name

    def _time(self, rec: StepRecord, when: datetime) -> None:
        """The step time of a newly stamped step: from the nearest earlier stamped step,
        or for the first one from the training-start line."""
        at = bisect.bisect_left(self.order, rec.iteration)
        self.order.insert(at, rec.iteration)
        self.stamps[rec.iteration] = when
        if at > 0:
            prev = self.order[at - 1]
            since, steps = self.stamps[prev], rec.iteration - prev
        elif self.start is not None and self.start[0] <= rec.iteration:
            since, steps = self.start[1], rec.iteration - self.start[0] + 1
        else:
            self.untimed = rec.iteration
            return
        rec.step_time_s = (when - since).total_seconds() / steps

    def finish(self, state):
        total = state.scan.facts.get("total_iterations")
        records = state.records.get(self.name, {})
        for rec in records.values():
            rec.total_iterations = total if isinstance(total, int) else None
        if self.untimed is not None and self.untimed in records and self.order \
                and self.order[0] == self.untimed:
            state.scan.notes.append(
                f"torchtitan: the first logged step ({self.untimed + 1}) has no step time: "
                "the log holds no `Training starts at step` line before it to time it from")


FORMATS = ("trainbench",) + tuple(REGISTRY)


# --- the streaming scanner ---------------------------------------------------------------

class _Dispatcher:
    """Hands each marker line to the formats that asked for it."""

    def __init__(self, scan: LogScan):
        self.scan = scan
        self.state = ScanState(scan)
        # Fresh instances: a format may keep state while it reads one file.
        self.formats = {name: type(fmt)() for name, fmt in REGISTRY.items()}
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


# --- the line that says why a run failed -------------------------------------------------------

_ERROR_MARKERS = (b"Error", b"Exception", b"exception", b"error:", b"Traceback", b"Killed",
                  b"out of memory", b"CANCELLED", b"Watchdog caught", b"NCCL error",
                  b"Segmentation fault", b"SIGSEGV", b"SIGKILL", b"NODE FAILURE",
                  b"TIME LIMIT", b"No space left", b"timed out", b"Timeout", b"exitcode",
                  b"Signal ", b"NODE_FAIL", b"Node failure")
# `RuntimeError: ...`, `srun: error: ...`, `torch.OutOfMemoryError: ...`: the line that says
# what went wrong, preferred over `Traceback (most recent call last):` and the like.
_STRONG_ERROR = re.compile(
    r"\b\w*(?:Error|Exception)\b:|\berror:|out of memory|CANCELLED|\bKilled\b")
# The last bytes of a failed log hold its cause; a cause is looked for this far back.
_CAUSE_WINDOW = 32 * 2**20


def find_failure(path: str | Path, chunk_size: int = CHUNK_SIZE,
                 max_bytes: int | None = None) -> tuple[str | None, str | None]:
    """(failure class, line) of a log: among its last lines, the line of the most
    specific known cause (status.FAILURE_CLASSES: out of memory before the NCCL timeout
    it provokes, before the SIGABRT that follows); without one, the last error-looking
    line (an exception message preferred over a bare `Traceback`) and class None.
    max_bytes: read no further back than this from the end."""
    from .status import classify_failure, failure_rank
    weak: str | None = None
    strong: str | None = None
    best: tuple[int, str, str] | None = None
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
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
                lines.append(_cut(buf, seg_start, seg_end).decode("utf-8", "replace").strip())
            for line in reversed(lines):
                if not line or "train_step_timing" in line:
                    continue
                line = line[:500]
                cls = classify_failure(line)
                if cls is not None:
                    rank = failure_rank(cls)
                    if best is None or rank < best[0]:
                        best = (rank, cls, line)
                elif _STRONG_ERROR.search(line):
                    strong = strong or line
                else:
                    weak = weak or line
            tail = buf[:cut]
            end = start
            if best is not None and size - end >= _CAUSE_WINDOW:
                break
            if best is None and strong is not None:
                break
            if max_bytes is not None and size - end >= max_bytes:
                break
    if best is not None:
        return best[1], best[2]
    return None, strong or weak


def find_last_error(path: str | Path, chunk_size: int = CHUNK_SIZE) -> str | None:
    """The line that says why a run failed (see find_failure)."""
    return find_failure(path, chunk_size)[1]
