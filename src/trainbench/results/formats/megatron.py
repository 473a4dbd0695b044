"""Megatron-LM, Megatron-Bridge and Megatron-DeepSpeed: iteration lines, Bridge's `Step
Time` lines, the argument dump and the memory report."""

from __future__ import annotations

import math
import re

from ..parse import (_ITERATION, _NUM, LogFormat, ScanState, StepRecord, fill, int_fact,
                     key_values, register)


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
            state.fact(_MEGATRON_ARGS[key], int_fact(value))
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
