"""The dtype a run or a prediction uses when none is given. Pure Python (no torch: planning
stays fast).

GPUs run bf16, the recipes' own dtype. A CPU runs bf16 only where it has native bf16
instructions (AVX512-BF16 or AMX-BF16); elsewhere PyTorch emulates bf16 GEMMs, several times
slower than fp32 for the tiny Llama on a 2-core AVX2 EPYC (0.31 s vs 0.115 s per step on
2 ranks), so fp32 is the default there.
"""

from __future__ import annotations

from .catalog.recipes import dtypes_for

CPUINFO = "/proc/cpuinfo"
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def native_bf16_flags(cpuinfo: str) -> list[str]:
    """The native-bf16 flags the CPU advertises in /proc/cpuinfo text ('flags' lines)."""
    found: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            found.update(flag for flag in value.split() if flag in NATIVE_BF16_FLAGS)
    return sorted(found)


def read_cpuinfo(path: str = CPUINFO) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def default_dtype(gpu_type: str, cpuinfo: str | None = None,
                  available: list[str] | None = None) -> tuple[str, str]:
    """(dtype, why) for a plan on `gpu_type` ('cpu' or a GPU key); cpuinfo is
    /proc/cpuinfo's text, read from this machine when not given. `available` (the
    workload's recipe dtypes) makes a workload without the preferred dtype take the
    recipe's own (Nemotron-H 56B is FP8 only)."""
    if gpu_type.lower() != "cpu":
        dtype, why = "bf16", "default on GPUs: the recipes' dtype"
    else:
        flags = native_bf16_flags(read_cpuinfo() if cpuinfo is None else cpuinfo)
        if flags:
            dtype, why = "bf16", f"default on this CPU: native bf16 ({', '.join(flags)})"
        else:
            dtype, why = "fp32", ("default on this CPU: no native bf16 (avx512_bf16/amx_bf16), "
                                  "bf16 GEMMs would be emulated, several times slower than fp32")
    if available and dtype not in available:
        fallback = next((d for d in ("bf16", "fp32", "fp8") if d in available), available[0])
        return fallback, f"the workload's only recipe dtypes are {', '.join(available)}"
    return dtype, why


def default_dtype_for(workload: str, size: str, gpu_type: str) -> tuple[str, str]:
    """default_dtype for a workload of the catalog (an unknown one gets the machine's
    default, and planning then names what is wrong)."""
    try:
        available = dtypes_for(workload, size.lower())
    except (KeyError, LookupError, ValueError):
        available = []
    return default_dtype(gpu_type, available=available)
