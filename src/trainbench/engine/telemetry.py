"""Clocks, power, temperature, throttling and energy during the timed window.

One background thread per node (on local rank 0) samples what the machine offers: on
GPUs NVML's SM clock, power draw, temperature and clock-event (throttle) reasons, with the
total-energy counter read at the window's start and end; on a CPU the cpufreq clocks,
thermal zones and RAPL energy counters under /sys where they exist.

The sampler must never slow or crash training: it reads a few counters every
INTERVAL_S on its own thread, and any exception it meets is caught and named in
`missing`. What could not be measured is said, never guessed.
"""

from __future__ import annotations

import glob
import re
import threading
import time

import torch

from ..conditions import nvml_module

INTERVAL_S = 0.25

# NVML clock-event ("throttle") reason bits, as documented in nvml.h ("Clocks Event
# Reasons" / nvmlClocksEventReason*, formerly nvmlClocksThrottleReason*), NVML API
# Reference Manual: https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html
CLOCK_EVENT_REASONS = {
    0x001: "gpu idle",
    0x002: "applications clocks setting",
    0x004: "sw power cap",
    0x008: "hw slowdown",
    0x010: "sync boost",
    0x020: "sw thermal slowdown",
    0x040: "hw thermal slowdown",
    0x080: "hw power brake slowdown",
    0x100: "display clock setting",
}
# Only these lower the clocks below what the run asked for because of power or heat: an
# idle GPU, a sync boost group or an application clock setting are not throttling.
SLOWDOWN_BITS = 0x004 | 0x008 | 0x020 | 0x040 | 0x080


def decode_clock_reasons(mask: int) -> tuple[list[str], bool]:
    """(names of the set bits, whether any of them is a real slowdown)."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"unknown reason bits {unknown:#x}")
    return names, bool(mask & SLOWDOWN_BITS)


def slowdown_names(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit & SLOWDOWN_BITS]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def stats(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"min": min(values), "mean": sum(values) / len(values), "max": max(values)}


class _Source:
    """What one kind of machine can be asked; every read may raise (caught by Sampler)."""

    name: str | None = None
    energy_covers: str = ""

    def energy_j(self) -> float | None:
        return None

    def sample(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class NvmlSource(_Source):
    name = "nvml"

    def __init__(self, nvml, handles: list, missing: list[str]):
        self.nvml, self.handles, self.missing = nvml, handles, missing
        self.energy_covers = f"{len(handles)} GPU(s) of this node (NVML energy counters)"
        self._reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons")
        self._processes = getattr(nvml, "nvmlDeviceGetComputeRunningProcesses", None)

    def energy_j(self) -> float | None:
        # mJ since the driver loaded; a GPU older than Volta has no counter
        return sum(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles) / 1e3

    def sample(self) -> dict:
        n = self.nvml
        out = {"sm_clock_mhz": [], "power_w": [], "temperature_c": [], "reasons": 0}
        for h in self.handles:
            out["sm_clock_mhz"].append(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))
            out["power_w"].append(n.nvmlDeviceGetPowerUsage(h) / 1e3)  # mW
            out["temperature_c"].append(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
            out["reasons"] |= int(self._reasons(h))
        if self._processes is not None:
            try:
                out["processes"] = [len(self._processes(h)) for h in self.handles]
            except Exception as err:  # noqa: BLE001 - a VM or MIG may not say; said once
                self._processes = None
                self.missing.append(f"processes on the GPUs: {type(err).__name__}: {err}")
        return out

    def close(self) -> None:
        self.nvml.nvmlShutdown()


class CpuSysfsSource(_Source):
    name = "cpu sysfs"

    def __init__(self, missing: list[str]):
        self.freq_files = sorted(glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/"
                                           "scaling_cur_freq"))
        if not self.freq_files:
            missing.append("cpu clock: /sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq "
                           "absent (no cpufreq driver here, e.g. a VM)")
        self.thermal_files = sorted(glob.glob("/sys/class/thermal/thermal_zone*/temp"))
        if not self.thermal_files:
            missing.append("temperature: no /sys/class/thermal/thermal_zone*/temp")
        # Top-level RAPL domains only (a package each): sub-domains are counted inside them.
        self.rapl = [d for d in sorted(glob.glob("/sys/class/powercap/intel-rapl:*"))
                     if re.fullmatch(r".*/intel-rapl:\d+", d)]
        self.rapl_readable = []
        for d in self.rapl:
            try:
                self._read_int(f"{d}/energy_uj")
                self.rapl_readable.append(d)
            except OSError as err:
                missing.append(f"energy: {d}/energy_uj unreadable ({err.strerror}; "
                               "root-only since Linux 5.10)")
        if not self.rapl:
            missing.append("energy: no RAPL counters (/sys/class/powercap/intel-rapl:* absent)")
        self.energy_covers = (f"{len(self.rapl_readable)} CPU package(s) of this node (RAPL: "
                              "every process on them, not this run alone)")
        self._last_uj: list[int] | None = None
        self._total_uj = 0
        self._lock = threading.Lock()  # the sampler thread and the step marks both read
        throttle = glob.glob("/sys/devices/system/cpu/cpu[0-9]*/thermal_throttle/"
                             "*_throttle_count")
        self.throttle_files = sorted(throttle)
        if not self.throttle_files:
            missing.append("throttling: no /sys/devices/system/cpu/cpu*/thermal_throttle "
                           "counters")
        self._throttle_start = self._throttle_count() if self.throttle_files else None

    @staticmethod
    def _read_int(path: str) -> int:
        with open(path) as fh:
            return int(fh.read().strip())

    def _throttle_count(self) -> int:
        return sum(self._read_int(p) for p in self.throttle_files)

    def energy_j(self) -> float | None:
        if not self.rapl_readable:
            return None
        with self._lock:
            now = [self._read_int(f"{d}/energy_uj") for d in self.rapl_readable]
            if self._last_uj is not None:
                for d, before, after in zip(self.rapl_readable, self._last_uj, now):
                    if after < before:  # the counter wrapped at max_energy_range_uj
                        after += self._read_int(f"{d}/max_energy_range_uj")
                    self._total_uj += after - before
            self._last_uj = now
            return self._total_uj / 1e6

    def sample(self) -> dict:
        out = {}
        if self.freq_files:
            khz = [self._read_int(p) for p in self.freq_files]
            out["cpu_clock_mhz"] = [k / 1e3 for k in khz]
        if self.thermal_files:
            out["temperature_c"] = [self._read_int(p) / 1e3 for p in self.thermal_files]
        if self.rapl_readable:
            self.energy_j()  # read often enough that a wrap is seen at most once
        return out

    def throttled(self) -> bool | None:
        if self._throttle_start is None:
            return None
        return self._throttle_count() > self._throttle_start


def _gpu_handles(nvml, local_gpus: int) -> list:
    """NVML handles of the GPUs this node's ranks use (the first `local_gpus` CUDA devices),
    matched by UUID since NVML numbers GPUs ignoring CUDA_VISIBLE_DEVICES."""
    handles = []
    for i in range(local_gpus):
        uuid = str(torch.cuda.get_device_properties(i).uuid)
        try:
            handles.append(nvml.nvmlDeviceGetHandleByUUID(
                uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"))
        except Exception:  # noqa: BLE001 - older torch: no uuid; fall back to the index
            handles.append(nvml.nvmlDeviceGetHandleByIndex(i))
    return handles


class Sampler:
    """Samples one node's telemetry on a background thread between start() and stop()."""

    def __init__(self, device_type: str, local_gpus: int = 1, interval_s: float = INTERVAL_S):
        self.interval_s = interval_s
        self.missing: list[str] = []
        self.samples: list[dict] = []
        self.source: _Source | None = None
        self.energy_start = self.energy_end = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            if device_type == "cuda":
                nvml = nvml_module(self.missing, "telemetry")
                if nvml is not None:
                    self.source = NvmlSource(nvml, _gpu_handles(nvml, local_gpus),
                                             self.missing)
            else:
                self.source = CpuSysfsSource(self.missing)
        except Exception as err:  # noqa: BLE001 - telemetry never stops a run
            self._note("telemetry source", err)

    def _note(self, what: str, err: BaseException) -> None:
        line = f"{what}: {type(err).__name__}: {err}"
        if line not in self.missing:
            self.missing.append(line)

    def _energy(self, what: str) -> float | None:
        try:
            return self.source.energy_j() if self.source else None
        except Exception as err:  # noqa: BLE001
            self._note(f"energy at {what}", err)
            return None

    def _sample_once(self) -> None:
        try:
            self.samples.append(self.source.sample())
        except Exception as err:  # noqa: BLE001
            self._note("sample", err)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample_once()

    def step_summary(self) -> dict | None:
        """This node's readings since the previous call (or the start): for one step's
        metrics.jsonl record. Energy is the counter's difference; readings are the
        samples the thread took meanwhile (none in a step shorter than the interval)."""
        if self.source is None or self._thread is None:
            return None
        try:
            n = len(self.samples)
            new, self._mark = self.samples[self._mark:n], n
            energy = self._energy("step")
            out = {"samples": len(new), "energy_j": None}
            if energy is not None and self._last_energy is not None:
                out["energy_j"] = energy - self._last_energy
            self._last_energy = energy
            for key, reduce in (("sm_clock_mhz", _mean), ("power_w", _mean),
                                ("temperature_c", max), ("cpu_clock_mhz", _mean)):
                values = [v for s in new for v in s.get(key, [])]
                if values:
                    out[key] = reduce(values)
            mask = 0
            for s in new:
                mask |= s.get("reasons", 0)
            if mask & SLOWDOWN_BITS:
                out["throttle_reasons"] = slowdown_names(mask)
            return out
        except Exception as err:  # noqa: BLE001
            self._note("step telemetry", err)
            return None

    def start(self) -> None:
        if self.source is None:
            return
        self._t0 = time.monotonic()
        self.energy_start = self._energy("window start")
        self._last_energy, self._mark = self.energy_start, 0
        self._sample_once()
        self._thread = threading.Thread(target=self._run, name="trainbench-telemetry",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> dict:
        """Stops sampling and returns this node's summary (the run.json `telemetry` keys)."""
        try:
            return self._stop_and_summarise()
        except Exception as err:  # noqa: BLE001
            self._note("telemetry summary", err)
            return {"source": None, "samples": 0, "energy_j": None, "throttled": None,
                    "throttle_reasons": [], "sm_clock_mhz": None, "power_w": None,
                    "temperature_c": None, "missing": self.missing}

    def _stop_and_summarise(self) -> dict:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._sample_once()  # the window's end, however short the window
        window_s = time.monotonic() - self._t0 if self._thread is not None else None
        self.energy_end = self._energy("window end") if self._thread is not None else None
        energy = None
        if self.energy_start is not None and self.energy_end is not None:
            energy = self.energy_end - self.energy_start
        elif self.source is not None and not any(m.startswith("energy") for m in self.missing):
            self.missing.append("energy: no energy counter on this device")

        def flat(key: str) -> list[float]:
            return [v for s in self.samples for v in s.get(key, [])]
        out = {"source": self.source.name if self.source else None,
               "samples": len(self.samples), "window_s": window_s,
               "energy_j": energy,
               "energy_covers": self.source.energy_covers if energy is not None else None,
               "throttled": None, "throttle_reasons": [],
               "sm_clock_mhz": stats(flat("sm_clock_mhz")),
               "power_w": stats(flat("power_w")),
               "temperature_c": stats(flat("temperature_c")),
               "missing": self.missing}
        if isinstance(self.source, NvmlSource):
            mask = 0
            for s in self.samples:
                mask |= s.get("reasons", 0)
            out["clock_event_reasons"] = decode_clock_reasons(mask)[0]
            out["throttle_reasons"] = slowdown_names(mask)
            out["throttled"] = bool(out["throttle_reasons"]) if self.samples else None
            out.update(shared_gpus([s["processes"] for s in self.samples if "processes" in s]))
        elif isinstance(self.source, CpuSysfsSource):
            out["cpu_clock_mhz"] = stats(flat("cpu_clock_mhz"))
            try:
                out["throttled"] = self.source.throttled()
            except Exception as err:  # noqa: BLE001
                self._note("throttling", err)
            if out["throttled"]:
                out["throttle_reasons"] = ["cpu thermal throttle count rose"]
        try:
            if self.source is not None:
                self.source.close()
        except Exception as err:  # noqa: BLE001
            self._note("close", err)
        return out


def shared_gpus(process_counts: list[list[int]]) -> dict:
    """From each sample's count of compute processes per GPU: the most each GPU had during
    the window, and the GPUs that had more than this run's one rank (another job, a
    probe left running, or a rank of this run on the wrong device). A GPU whose count
    NVML does not show (0: a container that hides other PIDs) is claimed for nothing."""
    if not process_counts:
        return {"gpu_processes_max": None, "shared_gpus": None}
    most = [max(column) for column in zip(*process_counts)]
    return {"gpu_processes_max": most,
            "shared_gpus": [i for i, count in enumerate(most) if count > 1]}


def combine(node: dict, energy_j_all_nodes: float | None, nodes: int, nodes_with_energy: int,
            nodes_throttled: int, tokens: int, nodes_shared: int = 0) -> dict:
    """Rank 0's node summary with the job-wide energy and throttling from every node."""
    out = dict(node)
    out["nodes"] = nodes
    if nodes_with_energy == nodes and energy_j_all_nodes is not None:
        out["energy_j"] = energy_j_all_nodes
        what = node.get("energy_covers") or "each node's counters"
        out["energy_covers"] = (f"{what}, summed over {nodes} node(s)" if nodes > 1 else what)
        out["energy_per_token_j"] = energy_j_all_nodes / tokens if tokens else None
    else:
        out["energy_j"] = None
        out["energy_per_token_j"] = None
        out["energy_covers"] = None
        if nodes_with_energy and nodes_with_energy < nodes:
            out["missing"] = list(out["missing"]) + [
                f"energy: only {nodes_with_energy} of {nodes} node(s) could read it, so no "
                "job total"]
    out["window_tokens"] = tokens
    if nodes_shared:
        out["gpu_shared"] = True
        if nodes > 1:
            out["gpu_shared_nodes"] = f"{nodes_shared} of {nodes} node(s)"
    elif node.get("shared_gpus") is not None:
        out["gpu_shared"] = False
    if nodes_throttled:
        out["throttled"] = True
        if nodes > 1:
            out["throttle_reasons"] = list(out["throttle_reasons"]) + [
                f"{nodes_throttled} of {nodes} node(s) throttled"]
    return out
