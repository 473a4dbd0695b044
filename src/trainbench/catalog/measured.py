"""Public MEASURED sustained figures per GPU type, each with its source, or None with the
reason none is stored. Pure data, no torch.

catalog.hardware holds spec-sheet peaks; this module holds what a GPU or its interconnect
was measured to sustain. `trainbench predict` uses a figure from here for a GPU type the
seeds never measured (predict/device.py), and says which figure came from where. A
figure is never a constant fitted to one workload: where no measurement could be cited,
the entry is None and its `reason` says what was looked for, so the predictor keeps its
catalog assumption and labels it an assumption. A hardware profile from `trainbench
probe` (predict --hardware) replaces all of these with the user's own measurements.

Sources
-------
REF_HW
    ../shared/reference/hardware.md (the project's reference facts), "Collectives on a
    DGX H100 (nccl-tests bus bandwidth)": all-reduce inside a node about 370 GB/s (ring),
    480 GB/s with NVLink SHARP at 1 GB and more; across nodes about 45 GB/s per 400 Gb/s
    NIC; about 10-20 us latency per collective; 1 MB messages reach about 67 GB/s.

Searched without a citable number (this session: NVIDIA NeMo / Megatron-Bridge
performance pages, the NVIDIA/dgxc-benchmarking repository and its history, AMD's ROCm
blog "Measuring Max-Achievable FLOPs - Part 2", arXiv 2512.02189 "Microbenchmarking
NVIDIA's Blackwell Architecture"): the pages were found but the excerpts available here did
not include their result tables, so no figure from them is stored. Issue #18 quotes about
795 of 989 TFLOPS for H100 BF16 GEMMs without a source; it is not stored either.
"""

from __future__ import annotations

from dataclasses import dataclass

REF_HW = "../shared/reference/hardware.md, 'Collectives on a DGX H100 (nccl-tests bus bandwidth)'"

_NO_GEMM = ("no public sustained dense-GEMM figure with a readable table was found "
            "(searched NVIDIA performance pages, dgxc-benchmarking, AMD ROCm MAF blog, arXiv "
            "2512.02189); measure it with `trainbench probe` and pass --hardware")
_NO_LINK = ("no published nccl-tests result for this system was found; measure it with "
            "`trainbench probe` and pass --hardware")
_SAME_AS_H100 = ("H200 SXM boards use the same NVLink 4 / NVSwitch generation and the same "
                 "400 Gb/s ConnectX-7 NICs as DGX H100, so DGX H100's nccl-tests figures "
                 "are measurements of the same links")


@dataclass(frozen=True)
class Figure:
    """One measured figure, or None with the reason no figure is stored."""
    value: float | None
    unit: str
    source: str | None = None
    reason: str = ""

    @property
    def known(self) -> bool:
        return self.value is not None

    def describe(self) -> str:
        if self.known:
            note = f"; {self.reason}" if self.reason else ""
            return f"{self.value:g} {self.unit} (measured: {self.source}{note})"
        return f"not measured ({self.reason})"


@dataclass(frozen=True)
class MeasuredGPU:
    key: str
    gemm_tflops: dict[str, Figure]
    """Sustained dense GEMM TFLOPS per dtype at large shapes."""
    intra_node_busbw_gbs: Figure
    """All-reduce bus bandwidth inside an NVLink domain (nccl-tests, large messages)."""
    network_gbs: Figure
    """Bus bandwidth across nodes per GPU (its own NIC), nccl-tests."""
    collective_latency_us: Figure


def _gemm_unknown(*dtypes: str) -> dict[str, Figure]:
    return {d: Figure(None, "TFLOPS", reason=_NO_GEMM) for d in dtypes}


def _links_unknown() -> dict:
    return dict(intra_node_busbw_gbs=Figure(None, "GB/s", reason=_NO_LINK),
                network_gbs=Figure(None, "GB/s", reason=_NO_LINK),
                collective_latency_us=Figure(None, "us", reason=_NO_LINK))


_H100_LINKS = dict(
    # Ring all-reduce, the algorithm NCCL uses for the bucket sizes of a training step;
    # NVLS (480 GB/s) needs NVLink SHARP and messages of 1 GB or more.
    intra_node_busbw_gbs=Figure(370.0, "GB/s", REF_HW),
    network_gbs=Figure(45.0, "GB/s", REF_HW),
    # The middle of the 10-20 us range the reference gives.
    collective_latency_us=Figure(15.0, "us", REF_HW),
)

MEASURED: dict[str, MeasuredGPU] = {
    "h100": MeasuredGPU("h100", _gemm_unknown("bf16", "fp8"), **_H100_LINKS),
    "h200": MeasuredGPU("h200", _gemm_unknown("bf16", "fp8"),
                        **{k: Figure(f.value, f.unit, f.source, _SAME_AS_H100)
                           for k, f in _H100_LINKS.items()}),
    "b200": MeasuredGPU("b200", _gemm_unknown("bf16", "fp8"), **_links_unknown()),
    "b300": MeasuredGPU("b300", _gemm_unknown("bf16", "fp8"), **_links_unknown()),
    "gb200": MeasuredGPU("gb200", _gemm_unknown("bf16", "fp8"), **_links_unknown()),
    "gb300": MeasuredGPU("gb300", _gemm_unknown("bf16", "fp8"), **_links_unknown()),
    "mi300x": MeasuredGPU("mi300x", _gemm_unknown("bf16", "fp8"), **_links_unknown()),
}

LINK_FIELDS = ("intra_node_busbw_gbs", "network_gbs", "collective_latency_us")


def measured_for(gpu_type: str) -> MeasuredGPU | None:
    return MEASURED.get(gpu_type.lower())
