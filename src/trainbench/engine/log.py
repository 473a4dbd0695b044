"""The per-step log line and metrics record. No torch: results/ imports this too.

The line follows NeMo 2 so `grep train_step_timing` and NVIDIA's own parsers work on
trainbench logs; metrics.jsonl carries the same step as one JSON object per line.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass


@dataclass
class StepMetrics:
    iteration: int
    """0-based, as NeMo prints it (`iteration 49/49` is the 50th step)."""
    total_iterations: int
    lr: float
    global_batch_size: int
    loss: float
    """Loss averaged over the global batch (reduced across data-parallel ranks)."""
    grad_norm: float
    step_time_s: float
    tflops_per_gpu: float
    tokens_per_s: float
    peak_memory_bytes: int
    """On a GPU the allocator's peak of reserved bytes (NeMo's peak_memory_usage; what an
    out-of-memory error is decided against); on a CPU the process's peak resident set."""
    memory_allocated_bytes: int
    consumed_samples: int
    time: float
    """Unix time at the end of the step."""
    peak_allocated_bytes: int | None = None
    """On a GPU the peak of allocated bytes: what predict's memory model describes before
    its fragmentation allowance (metrics.jsonl only; the log line keeps NeMo's fields)."""

    def to_json(self) -> str:
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, float) and not math.isfinite(value):
                data[key] = str(value)  # JSON has no NaN; parsers read 'nan'/'inf' back
        return json.dumps(data)


def format_step_line(m: StepMetrics) -> str:
    return (
        f"Training epoch 0, iteration {m.iteration}/{m.total_iterations - 1} | lr: {m.lr:.4e} | "
        f"global_batch_size: {m.global_batch_size} | global_step: {m.iteration} | "
        f"peak_memory_usage: {m.peak_memory_bytes} | memory_allocated: {m.memory_allocated_bytes} | "
        f"reduced_train_loss: {m.loss:.4f} | grad_norm: {m.grad_norm:.4f} | "
        f"train_step_timing in s: {m.step_time_s:.4f} | TFLOPS_per_GPU: {_tflops(m.tflops_per_gpu)} | "
        f"consumed_samples: {m.consumed_samples}"
    )


def _tflops(value: float) -> str:
    # Two decimals as NeMo prints GPU figures; a tiny CPU run keeps significant digits.
    return f"{value:.2f}" if value >= 10 else f"{value:.4g}"
