"""Peak dense TFLOPS of the device a rank runs on.

GPUs take the catalog's published peak (or the user's --peak-tflops); an unknown GPU is
an error, never a borrowed figure. A CPU has no published peak, so it is measured: the
best of a few square GEMMs in the run's compute dtype, labelled 'measured GEMM'.
"""

from __future__ import annotations

import time

import torch

from ..catalog import hardware
from ..plan import Plan


def measure_gemm_tflops(dtype: torch.dtype, n: int = 1024, seconds: float = 0.5) -> float:
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)  # warm-up: allocate and pick a kernel
    best = float("inf")
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e12


def resolve_peak(plan: Plan, compute_dtype: torch.dtype) -> tuple[float, str, str]:
    """(peak TFLOPS, where it came from, device name) for this rank's device."""
    if plan.device == "cpu":
        name = "CPU"
        if plan.peak_tflops:
            return plan.peak_tflops, "user", name
        return measure_gemm_tflops(compute_dtype), "measured GEMM", name
    name = torch.cuda.get_device_name()
    gpu = hardware.gpu_from_device_name(name)
    if plan.peak_tflops:
        source = "catalog" if gpu and gpu.peak(plan.dtype) == plan.peak_tflops else "user"
        return plan.peak_tflops, source, name
    if gpu is None or gpu.peak(plan.dtype) is None:
        raise RuntimeError(f"unknown device {name!r}: no published {plan.dtype} peak; "
                           "pass --peak-tflops")
    return gpu.peak(plan.dtype), "catalog", name
