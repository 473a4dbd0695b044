"""What the performance and memory models know about a GPU type and its interconnect.

The figures come from catalog.hardware (../shared/reference/hardware.md); a cluster
config may override the bandwidths under its 'bandwidth' key, per GPU type:

    bandwidth:
      h100: {network_gbs: 45, intra_node_busbw_gbs: 370, collective_latency_us: 15}

A device the catalog does not know is an error: the model never borrows another GPU's
figures. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ..catalog import hardware, measured

BANDWIDTH_KEY = "bandwidth"
BANDWIDTH_FIELDS = ("hbm_tbs", "intra_node_busbw_gbs", "network_gbs", "collective_latency_us",
                    "nvlink_domain")

GIB = 2.0 ** 30


@dataclass(frozen=True)
class Device:
    key: str
    name: str
    peak_tflops: dict[str, float]
    memory_gb: float
    """Nominal memory as NVIDIA quotes it ('80 GB'; the driver shows about 79.6 GiB)."""
    hbm_tbs: float
    gpus_per_node: int
    nvlink_domain: int
    """GPUs that reach each other over NVLink; collectives inside it use intra_node_busbw."""
    intra_node_busbw_gbs: float
    network_gbs: float
    """Bus bandwidth across NVLink domains per GPU (its own NIC), nccl-tests convention."""
    collective_latency_us: float
    figures: tuple[tuple[str, str], ...] = ()
    """Where each figure the model uses came from: (figure, source) pairs, e.g.
    ('network_gbs', 'measured: ...') or ('gemm_eff_bf16', 'assumed: ...')."""

    def peak(self, dtype: str) -> float:
        """Dense peak TFLOPS; fp32 runs use the bf16 tensor-core peak as the catalog does."""
        value = self.peak_tflops.get("bf16" if dtype == "fp32" else dtype)
        if value is None:
            raise LookupError(f"{self.name} has no {dtype} peak in the catalog")
        return float(value)

    @property
    def capacity_gib(self) -> float:
        # The driver exposes about 99.5% of the nominal size (81559 MiB of an 80 GB H100).
        return self.memory_gb * 0.995


def device_for(gpu_type: str, gpus_per_node: int | None = None,
               config: dict | None = None) -> Device:
    """The device of a GPU type with the cluster config's bandwidth overrides applied.

    LookupError for an unknown type or a CPU (no published peak: nothing to predict from).
    """
    if gpu_type.lower() == hardware.CPU:
        raise LookupError("a CPU has no published peak or bandwidth to predict from; "
                          "predict for a GPU type with --gpu (e.g. --gpu h100)")
    gpu = hardware.get_gpu(gpu_type)
    per_node = gpus_per_node or gpu.gpus_per_node
    domain = getattr(gpu, "nvlink_domain", 0) or per_node
    dev = Device(key=gpu.key, name=gpu.name, peak_tflops=dict(gpu.peak_tflops),
                 memory_gb=gpu.memory_gb, hbm_tbs=gpu.hbm_tbs, gpus_per_node=per_node,
                 nvlink_domain=max(domain, per_node),
                 intra_node_busbw_gbs=gpu.intra_node_busbw_gbs, network_gbs=gpu.network_gbs,
                 collective_latency_us=gpu.collective_latency_us)
    dev = with_measured_links(dev)
    overrides = bandwidth_overrides(config or {}, gpu.key)
    if overrides:
        dev = replace(dev, **overrides, figures=_relabel(
            dev.figures, {k: "cluster config 'bandwidth'" for k in overrides}))
    return dev


def _relabel(figures: tuple, new: dict[str, str]) -> tuple:
    out = dict(figures)
    out.update(new)
    return tuple(out.items())


def with_measured_links(dev: Device) -> Device:
    """The device with catalog.measured's interconnect figures where one was measured,
    each figure labelled with where it came from (a catalog assumption otherwise)."""
    entry = measured.measured_for(dev.key)
    values, labels = {}, {}
    for name in measured.LINK_FIELDS:
        fig = getattr(entry, name) if entry else None
        if fig is not None and fig.known:
            values[name] = float(fig.value)
            labels[name] = "measured: " + fig.source + (f" ({fig.reason})" if fig.reason else "")
        else:
            labels[name] = ("assumed: catalog.hardware figure, not a measurement"
                            + (f" ({fig.reason})" if fig is not None else ""))
    return replace(dev, **values, figures=_relabel(dev.figures, labels))


def bandwidth_overrides(config: dict, gpu_key: str) -> dict:
    """The 'bandwidth' entries of the cluster config for one GPU type (ValueError if malformed)."""
    section = config.get(BANDWIDTH_KEY) or {}
    if not isinstance(section, dict):
        raise ValueError(f"cluster config key '{BANDWIDTH_KEY}' must be a mapping of GPU type "
                         "to bandwidth figures")
    entry = section.get(gpu_key) or {}
    if not isinstance(entry, dict):
        raise ValueError(f"cluster config '{BANDWIDTH_KEY}.{gpu_key}' must be a mapping")
    known = {f.name for f in fields(Device)}
    out = {}
    for key, value in entry.items():
        if key not in BANDWIDTH_FIELDS or key not in known:
            raise ValueError(f"cluster config '{BANDWIDTH_KEY}.{gpu_key}.{key}': unknown field; "
                             f"known: {', '.join(BANDWIDTH_FIELDS)}")
        if not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"cluster config '{BANDWIDTH_KEY}.{gpu_key}.{key}' must be a "
                             "positive number")
        out[key] = int(value) if key == "nvlink_domain" else float(value)
    return out
