"""NeMo 2's step lines (`Training epoch 0, iteration 49/49 | ... | train_step_timing in s:
12.39 | ...`, also trainbench's own log) and NeMo 1's progress bars, with the config
echo both print."""

from __future__ import annotations

import math
import re

from ..parse import _ITERATION, LogFormat, ScanState, StepRecord, fill, key_values, register


# --- NeMo 2 and NeMo 1 ------------------------------------------------------------

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
