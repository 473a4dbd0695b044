"""GPU peaks, memory and interconnects (../shared/reference/hardware.md). Pure data.

An unknown device is an error unless the user gives its peak: never borrow another
device's figure (other tools report MFU above 100% that way).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GPU:
    key: str
    name: str
    peak_tflops: dict[str, float]
    """Dense peak per dtype: 'bf16', 'fp8', 'mxfp8', 'nvfp4' where the device has it.

    A dtype is runnable exactly where it has a peak here: FP8 from Hopper (and MI300X) on,
    MXFP8 and NVFP4 (block-scaled formats) on Blackwell only. Blackwell runs MXFP8 at its
    FP8 rate (the block scales are applied inside the tensor-core MMA), so 'mxfp8' repeats
    the FP8 figure of ../shared/reference/hardware.md."""
    memory_gb: float
    hbm_tbs: float
    nvlink_gbs: float
    """NVLink bandwidth per GPU, GB/s (one direction summed over links, as NVIDIA quotes)."""
    gpus_per_node: int
    network_gbs: float = 45.0
    """Bus bandwidth across nodes per GPU, GB/s: one 400 Gb/s NIC per GPU (nccl-tests)."""
    intra_node_busbw_gbs: float = 370.0
    """All-reduce bus bandwidth inside a node or NVLink domain (ring), GB/s."""
    collective_latency_us: float = 15.0
    name_patterns: tuple[str, ...] = field(default=())
    """Substrings of the CUDA device name that identify this GPU."""
    nvlink_domain: int = 0
    """GPUs joined by NVLink (GB200 NVL72: 72); 0 = the node (gpus_per_node)."""

    def peak(self, dtype: str) -> float | None:
        # fp32 runs on GPUs are not a seed workload; bf16 is the reference peak for them.
        return self.peak_tflops.get("bf16" if dtype == "fp32" else dtype)


# network_gbs follows the NIC per GPU: DGX B200 and GB200 NVL72 carry one 400 Gb/s
# ConnectX-7 per GPU, as DGX H100 does ("8x ConnectX-7 IB NDR 400Gb/s", "4x ConnectX-7 IB
# NDR 400 Gb/s" per 4-GPU tray: NVIDIA's MLPerf Training system descriptions, Nyx
# DGX B200 v5.0 and Tyche GB200 NVL72 v5.1); GB300 NVL72 carries an 800 Gb/s ConnectX-8
# per GPU (Theia GB300 NVL72, v5.1: "4x ConnectX-8 IB XDR 800 Gb/s"). B300's 90 is an
# assumption (no system description of it was cited).
GPUS: dict[str, GPU] = {
    "a100": GPU("a100", "A100 SXM 80GB", {"bf16": 312}, 80, 2.0, 600, 8,
                network_gbs=22.5, intra_node_busbw_gbs=230, name_patterns=("A100",)),
    "h100": GPU("h100", "H100 SXM", {"bf16": 989, "fp8": 1979}, 80, 3.35, 900, 8,
                name_patterns=("H100",)),
    "h200": GPU("h200", "H200 SXM", {"bf16": 989, "fp8": 1979}, 141, 4.8, 900, 8,
                name_patterns=("H200",)),
    "b200": GPU("b200", "B200",
                {"bf16": 2250, "fp8": 4500, "mxfp8": 4500, "nvfp4": 9000},
                180, 8, 1800, 8,
                network_gbs=45, intra_node_busbw_gbs=740, name_patterns=("B200",)),
    "b300": GPU("b300", "B300",
                {"bf16": 2250, "fp8": 4500, "mxfp8": 4500, "nvfp4": 13500},
                270, 8, 1800, 8,
                network_gbs=90, intra_node_busbw_gbs=740, name_patterns=("B300",)),
    "gb200": GPU("gb200", "GB200",
                 {"bf16": 2450, "fp8": 4900, "mxfp8": 4900, "nvfp4": 9800},
                 186, 8, 1800, 4,
                 network_gbs=45, intra_node_busbw_gbs=740, name_patterns=("GB200",),
                 nvlink_domain=72),
    "gb300": GPU("gb300", "GB300",
                 {"bf16": 2450, "fp8": 4900, "mxfp8": 4900, "nvfp4": 14700},
                 279, 8, 1800, 4,
                 network_gbs=90, intra_node_busbw_gbs=740, name_patterns=("GB300",),
                 nvlink_domain=72),
    "mi300x": GPU("mi300x", "MI300X", {"bf16": 1307, "fp8": 2615}, 192, 5.3, 896, 8,
                  intra_node_busbw_gbs=300, name_patterns=("MI300X",)),
}

# "cpu" is a device type too: it has no published peak, so MFU on a CPU is measured
# against a GEMM benchmark at run time and labelled as such.
CPU = "cpu"


def get_gpu(key: str) -> GPU:
    key = key.lower()
    if key not in GPUS:
        raise LookupError(
            f"unknown GPU type {key!r}; known types: {', '.join(GPUS)} (or 'cpu'); "
            "for another device pass --peak-tflops")
    return GPUS[key]


def gpu_from_device_name(device_name: str) -> GPU | None:
    """Match a CUDA device name such as 'NVIDIA H100 80GB HBM3'; None when unknown.

    GB200 is tested before B200 because its name contains 'B200'.
    """
    for gpu in sorted(GPUS.values(), key=lambda g: -max(len(p) for p in g.name_patterns)):
        if any(p in device_name for p in gpu.name_patterns):
            return gpu
    return None
