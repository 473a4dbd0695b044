"""torchao's FP8 grouped GEMM under fake tensors on a machine without Triton.

The FP8 experts (engine/parallel/float8.py wrap_experts) run torchao's `_Float8GroupedMM`,
which quantises with four Triton kernels and multiplies with torch._scaled_grouped_mm.
Where Triton is installed (a GPU machine) each kernel is a custom op with a fake
implementation, and a trace under FakeTensorMode allocates exactly its outputs. Without
Triton (check's usual CPU machine) torchao defines them as functions that raise, so the
trace could not pass the experts. `fake_fp8_grouped_kernels` puts torchao's own fake
implementations in their place for the trace: the same output shapes, dtypes and
strides (torchao 0.18, `kernels/float8_rowwise.py` and `kernels/jagged_float8_scales.py`,
each `register_fake`), so the tracker counts what the GPU kernels allocate. They compute
nothing, and the trace's tensors hold no values anyway.
"""

from __future__ import annotations

import contextlib

import torch

_E4M3 = torch.float8_e4m3fn


def rowwise_2d_scale_and_cast(hp, output_dtype=_E4M3, round_scales_to_power_of_2=False):
    """[M, K] -> (FP8 [M, K] row-major, fp32 scales [M, 1])."""
    m, k = hp.shape
    return (torch.empty((m, k), dtype=output_dtype, device=hp.device),
            torch.empty((m, 1), dtype=torch.float32, device=hp.device))


def colwise_3d_scale_and_cast(hp, output_dtype=_E4M3, round_scales_to_power_of_2=False):
    """[E, K, N] -> (FP8 [E, K, N] column-major, fp32 scales [E, 1, N])."""
    e, k, n = hp.shape
    data = torch.empty((e, k, n), dtype=output_dtype, device=hp.device)
    return (data.as_strided((e, k, n), (k * n, 1, k)),
            torch.empty((e, 1, n), dtype=torch.float32, device=hp.device))


def rowwise_3d_transpose_rhs(hp, output_dtype=_E4M3, round_scales_to_power_of_2=False):
    """[E, K, N] -> (FP8 [E, N, K] column-major, fp32 scales [E, K])."""
    e, k, n = hp.shape
    data = torch.empty((e, n, k), dtype=output_dtype, device=hp.device)
    return (data.as_strided((e, n, k), (n * k, 1, n)),
            torch.empty((e, k), dtype=torch.float32, device=hp.device))


def per_group_colwise_scales_dual(hp1, hp2, offsets, output_dtype=_E4M3,
                                  round_scales_to_power_of_2=False):
    """Two [K, N_i] -> for each, (FP8 [K, N_i] column-major, fp32 scales [N_i x groups])."""
    k = hp1.shape[0]
    groups = offsets.numel()
    out = []
    for hp in (hp1, hp2):
        data = torch.empty_like(hp, dtype=output_dtype).as_strided(hp.size(), (1, k))
        out += [data, torch.empty(hp.shape[1] * groups, dtype=torch.float32,
                                  device=hp.device)]
    return tuple(out)


_STANDINS = {"triton_fp8_rowwise_2d_scale_and_cast": rowwise_2d_scale_and_cast,
             "triton_fp8_colwise_3d_scale_and_cast": colwise_3d_scale_and_cast,
             "triton_fp8_rowwise_3d_transpose_rhs": rowwise_3d_transpose_rhs,
             "triton_fp8_per_group_colwise_scales_dual": per_group_colwise_scales_dual}


@contextlib.contextmanager
def fake_fp8_grouped_kernels():
    """torchao's FP8 grouped GEMM kernels replaced by their fake implementations while
    tracing, where Triton is missing (with Triton its custom ops have their own)."""
    try:
        from torch.utils._triton import has_triton
        from torchao.prototype.moe_training import fp8_grouped_mm
    except ImportError:  # no torchao: no FP8 experts to trace
        yield
        return
    if has_triton():
        yield
        return
    saved = {name: getattr(fp8_grouped_mm, name) for name in _STANDINS
             if hasattr(fp8_grouped_mm, name)}
    for name in saved:
        setattr(fp8_grouped_mm, name, _STANDINS[name])
    try:
        yield
    finally:
        for name, kernel in saved.items():
            setattr(fp8_grouped_mm, name, kernel)
