"""Peak dense TFLOPS of the device a rank runs on.

GPUs take the catalog's published peak (or the user's --peak-tflops); an unknown GPU is
an error, never a borrowed figure.

A CPU has no published peak, so it is measured, and the figure must be an upper bound
of what the model can reach, or the MFU comes out above 100%. One square `torch.mm` is
not: on a CPU without native bf16, ATen's bf16 GEMM is 3-30x faster in some operand
layouts than in others (here 11 GFLOPS for a transposed-A product, 0.8 for two
contiguous operands), and the model's linear layers use the fast ones. So the peak is
the best rate over the GEMMs the model really runs:

- every linear layer of the model (built on the meta device), at its per-rank shape:
  tokens per microbatch (MBS x sequence / CP) by its in and out features, the tensor-
  parallel dimension divided by TP (row-parallel for wo, w2, out_proj; column-parallel
  for the rest, the vocabulary-parallel output included); dimensions above 1024 are
  capped (CPU GEMM throughput saturates well below that);
- the three GEMMs of each layer: forward (x @ W^T, nn.Linear's layout), the input
  gradient (dy @ W) and the weight gradient (dy^T @ x);
- each of them in all four operand layouts (either operand contiguous or a transposed
  view), so the best layout counts even where the model's own is a slow path;
- in the run's compute dtype, under the run's autocast mode (a one-rank bf16 run uses
  autocast), with the operands already in that dtype (casts are no GEMM work), with the
  threads this rank really has (torch.get_num_threads() in the rank);
- each timed as the best of a few calls after a warm-up; all ranks measure at the same
  time, as they train, and the largest rank's figure is the peak.

run.json records the peak's GEMM (`peak_gemm`: shape, layout, dtype, threads, rate).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from ..catalog import hardware
from ..plan import Plan
from .models import build_model
from .parallel.tp import row_parallel_linears

MAX_DIM = 1024
LAYOUTS = ("NT", "NN", "TN", "TT")  # A then B: N contiguous, T a transposed view
# Extra layouts stop being tried once this much time went to measuring (a CPU run of a
# big model would otherwise spend minutes on slow paths); the model's own always run.
BUDGET_S = 3.0


@dataclass(frozen=True)
class Gemm:
    """C[m, n] = A[m, k] @ B[k, n] in one operand layout."""
    what: str
    m: int
    k: int
    n: int
    layout: str

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n


@dataclass(frozen=True)
class PeakGemm:
    tflops: float
    gemm: str
    m: int
    k: int
    n: int
    layout: str
    dtype: str
    threads: int
    autocast: bool
    candidates: int

    def to_dict(self) -> dict:
        return asdict(self)


def linear_shapes(plan: Plan) -> list[tuple[str, int, int]]:
    """(layer name, in features, out features) of the model's linear layers as one rank
    computes them (TP-local), without duplicates."""
    with torch.device("meta"):
        model = build_model(plan.model)
    row_parallel = row_parallel_linears()
    tp = plan.layout.tp
    shapes: dict[tuple[int, int], str] = {}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        leaf = name.rsplit(".", 1)[-1]
        d_in, d_out = module.in_features, module.out_features
        if leaf in row_parallel:
            d_in = max(1, d_in // tp)
        else:
            d_out = max(1, d_out // tp)
        shapes.setdefault((d_in, d_out), leaf)
    return [(leaf, d_in, d_out) for (d_in, d_out), leaf in shapes.items()]


def model_gemms(plan: Plan) -> list[Gemm]:
    """Forward and backward GEMMs of every linear layer, model's own layouts first."""
    tokens = min(MAX_DIM, max(1, plan.mbs * plan.seq_len // plan.layout.cp))
    own, others = [], []
    for leaf, d_in, d_out in linear_shapes(plan):
        d_in, d_out = min(d_in, MAX_DIM), min(d_out, MAX_DIM)
        # (what, m, k, n, the layout the model itself uses)
        for what, m, k, n, layout in ((f"{leaf} forward", tokens, d_in, d_out, "NT"),
                                      (f"{leaf} input grad", tokens, d_out, d_in, "NN"),
                                      (f"{leaf} weight grad", d_out, tokens, d_in, "TN")):
            own.append(Gemm(what, m, k, n, layout))
            others += [Gemm(what, m, k, n, other) for other in LAYOUTS if other != layout]
    return own + others


def operands(g: Gemm, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    a = (torch.randn(g.m, g.k, dtype=dtype) if g.layout[0] == "N"
         else torch.randn(g.k, g.m, dtype=dtype).t())
    b = (torch.randn(g.k, g.n, dtype=dtype) if g.layout[1] == "N"
         else torch.randn(g.n, g.k, dtype=dtype).t())
    return a, b


def time_gemm(g: Gemm, dtype: torch.dtype, reps: int = 5, min_s: float = 0.02) -> float:
    """Best seconds of one call, after a warm-up (a slow path gets few calls)."""
    a, b = operands(g, dtype)
    t0 = time.perf_counter()
    torch.mm(a, b)
    best = time.perf_counter() - t0
    spent = best
    for _ in range(reps):
        if spent > min_s and best > min_s / reps:
            break
        t0 = time.perf_counter()
        torch.mm(a, b)
        t = time.perf_counter() - t0
        best, spent = min(best, t), spent + t
    return best


def measure_peak(plan: Plan, dtype: torch.dtype, autocast: bool = False) -> PeakGemm:
    """The best rate of the model's GEMMs on this rank (see the module's docstring)."""
    gemms = model_gemms(plan)
    own = len(gemms) // 4
    ctx = torch.autocast("cpu", dtype=dtype) if autocast else contextlib.nullcontext()
    best_rate, best_gemm, tried = 0.0, gemms[0], 0
    timed: set[tuple[int, int, int, str]] = set()
    start = time.perf_counter()
    with ctx, torch.no_grad():
        for i, g in enumerate(gemms):
            if i >= own and time.perf_counter() - start > BUDGET_S:
                break
            # Layers of one width share GEMMs (wq and wo forward, w1 and w3): once is enough.
            if (g.m, g.k, g.n, g.layout) in timed:
                continue
            timed.add((g.m, g.k, g.n, g.layout))
            rate = g.flops / time_gemm(g, dtype) / 1e12
            tried += 1
            if rate > best_rate:
                best_rate, best_gemm = rate, g
    name = {torch.bfloat16: "bf16", torch.float32: "fp32"}.get(dtype, str(dtype))
    return PeakGemm(best_rate, best_gemm.what, best_gemm.m, best_gemm.k, best_gemm.n,
                    best_gemm.layout, name, torch.get_num_threads(), autocast, tried)


def measured_peak_all_ranks(plan: Plan, dtype: torch.dtype, autocast: bool) -> PeakGemm:
    """Every rank measures at once (sharing the cores as in training); the largest
    figure is the peak, so no rank's MFU can exceed it on a lucky step."""
    if not dist.is_initialized():
        return measure_peak(plan, dtype, autocast)
    dist.barrier()
    mine = measure_peak(plan, dtype, autocast).to_dict()
    every: list[dict] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(every, mine)
    return PeakGemm(**max(every, key=lambda peak: peak["tflops"]))


def resolve_peak(plan: Plan, compute_dtype: torch.dtype, autocast: bool = False
                 ) -> tuple[float, str, str, dict | None]:
    """(peak TFLOPS, where it came from, device name, the measured GEMM or None)."""
    if plan.device == "cpu":
        name = "CPU"
        if plan.peak_tflops:
            return plan.peak_tflops, "user", name, None
        peak = measured_peak_all_ranks(plan, compute_dtype, autocast)
        return peak.tflops, "measured GEMM", name, peak.to_dict()
    name = torch.cuda.get_device_name()
    gpu = hardware.gpu_from_device_name(name)
    if plan.peak_tflops:
        source = "catalog" if gpu and gpu.peak(plan.dtype) == plan.peak_tflops else "user"
        return plan.peak_tflops, source, name, None
    if gpu is None or gpu.peak(plan.dtype) is None:
        raise RuntimeError(f"unknown device {name!r}: no published {plan.dtype} peak; "
                           "pass --peak-tflops")
    return gpu.peak(plan.dtype), "catalog", name, None
