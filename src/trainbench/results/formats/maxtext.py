"""MaxText's `completed step: 49, seconds: 7.908, TFLOP/s/device: ...` lines and its
`Config param` echo."""

from __future__ import annotations

import re

from ..parse import LogFormat, StepRecord, fill, int_fact, key_values, register


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
                state.fact(_MAXTEXT_FACTS[key], int_fact(value))
            elif key == "dtype" and value in _MAXTEXT_DTYPES:
                state.scan.facts.setdefault("dtype", _MAXTEXT_DTYPES[value])
            elif key == "quantization" and "fp8" in value:
                state.fact("dtype", "fp8")
            elif key == "profiler" and value not in ("", "none", "None", "''"):
                state.profiled(text)
