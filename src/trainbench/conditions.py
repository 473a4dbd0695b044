"""The conditions a run ran under: versions, hardware, clocks, Slurm facts, environment.

"I cannot reproduce your number" usually means a driver, a NCCL version, a clock or an
environment variable differed and nobody wrote it down. `collect()` writes it down, once
per node, into run.json (`conditions`) and `conditions-<hostname>.json`.

Torch-free at import: the CLI may import this module; torch is imported inside the
functions that need it. NVML comes from `nvidia-ml-py` (the optional `gpu` extra); without
it, or without a GPU, `missing` says so instead of guessing.

Nothing secret is ever recorded: only variables with the prefixes in ENV_PREFIXES are
read at all, a name that looks secret has its value replaced, and a value that looks like
a credential (a Hugging Face or GitHub token, a URL with a password) is redacted wherever
it appears.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from importlib import metadata

from . import version as package_version

SCHEMA = 1
ENV_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "NVTE_", "OMP_", "PYTORCH_")
# The CUDA caching allocator's configuration, under torch's newer name and its older one.
ALLOCATOR_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
REDACTED = "<redacted>"
SECRET_NAME_PARTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "AUTH",
                     "COOKIE")
# Credentials recognisable by their shape, whatever variable carries them.
_SECRET_VALUES = re.compile(
    r"hf_[A-Za-z0-9]{8,}"                          # Hugging Face tokens
    r"|gh[pousr]_[A-Za-z0-9]{16,}"                 # GitHub tokens
    r"|github_pat_[A-Za-z0-9_]{16,}"
    r"|glpat-[A-Za-z0-9_-]{16,}"                   # GitLab
    r"|sk-[A-Za-z0-9_-]{16,}"                      # OpenAI-style API keys
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"              # Slack
    r"|(?:AKIA|ASIA)[A-Z0-9]{16}"                  # AWS access key ids
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*")  # JWTs
# scheme://user:password@host: the user stays, the password goes.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^@\s/]*@")
SLURM_VARS = {"job_id": "SLURM_JOB_ID", "nodelist": "SLURM_JOB_NODELIST",
              "nnodes": "SLURM_NNODES", "ntasks": "SLURM_NTASKS",
              "partition": "SLURM_JOB_PARTITION", "cluster": "SLURM_CLUSTER_NAME"}
# CPU features that decide which kernels (and so which speed) a CPU run gets.
CPU_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni",
             "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
             # aarch64 /proc/cpuinfo "Features"
             "asimd", "asimdhp", "sve", "sve2", "bf16", "i8mm")


# --- redaction --------------------------------------------------------------------------

def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(part in upper for part in SECRET_NAME_PARTS)


def redact_value(value: str) -> str:
    """The value with anything shaped like a credential replaced by <redacted>."""
    value = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED + "@", value)
    return _SECRET_VALUES.sub(REDACTED, value)


SHARED_GPU_LINE = ("another process held a GPU of this run during the timed window (NVML "
                   "counted more compute processes than this run's rank on it: another job, a "
                   "probe left running, or a rank on the wrong device): its timings may not "
                   "be this run's alone")


def allocator_setting(environ: Mapping[str, str] | None = None) -> str:
    """The allocator configuration a process with this environment runs, as 'NAME=value'
    for each variable set, or 'torch default' where neither is."""
    environ = os.environ if environ is None else environ
    settings = [f"{name}={environ[name]}" for name in ALLOCATOR_VARS if name in environ]
    return ", ".join(settings) or "torch default"


def recorded_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The NCCL_/TORCH_/CUDA_/NVTE_/OMP_/PYTORCH_ variables, secrets redacted, sorted by
    name."""
    environ = os.environ if environ is None else environ
    env = {}
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIXES):
            continue
        env[name] = REDACTED if is_secret_name(name) else redact_value(environ[name])
    return env


# --- host and CPU -----------------------------------------------------------------------

def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def cpu_info(missing: list[str], threads_per_rank: int | None = None) -> dict:
    text = _read("/proc/cpuinfo")
    model, flags = None, set()
    if text is None:
        missing.append("cpu model and flags: /proc/cpuinfo not readable")
    else:
        for line in text.splitlines():
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if model is None and key in ("model name", "cpu model", "hardware"):
                model = value.strip()
            elif key in ("flags", "features") and not flags:
                flags = set(value.split())
        if model is None:
            missing.append("cpu model: /proc/cpuinfo names none")
    model = model or platform.processor() or None
    return {"model": model, "cores": os.cpu_count(), "threads_per_rank": threads_per_rank,
            "flags": [f for f in CPU_FLAGS if f in flags]}


def memory_bytes(missing: list[str]) -> int | None:
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024  # the kernel writes kB (KiB)
    missing.append("memory: /proc/meminfo not readable")
    return None


def os_name() -> str:
    for line in (_read("/etc/os-release") or "").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return platform.platform()


def slurm_facts(environ: Mapping[str, str] | None = None) -> dict:
    environ = os.environ if environ is None else environ
    return {key: redact_value(environ[var]) for key, var in SLURM_VARS.items() if var in environ}


# --- versions ---------------------------------------------------------------------------

def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def versions(missing: list[str]) -> dict:
    import torch  # the engine has it already; the CLI never calls this
    out = {"trainbench": package_version(), "python": platform.python_version(),
           "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": None,
           "nccl": None,
           # the installed distribution's version: importing torchao costs seconds
           "torchao": _dist_version("torchao")}
    if out["cuda"] is None:
        missing.append("cuda, cudnn, nccl: this torch is a CPU build")
        return out
    try:
        out["cudnn"] = torch.backends.cudnn.version()
    except Exception as err:  # noqa: BLE001 - a version is a fact, never a crash
        missing.append(f"cudnn: {type(err).__name__}: {err}")
    try:
        nccl = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception as err:  # noqa: BLE001
        missing.append(f"nccl: {type(err).__name__}: {err}")
    return out


# --- GPUs -------------------------------------------------------------------------------

def nvml_module(missing: list[str], what: str = "gpus"):
    """pynvml, initialised, or None with the reason in `missing`."""
    try:
        import pynvml
    except ImportError:
        missing.append(f"{what}: NVML not available (nvidia-ml-py not installed: "
                       "pip install 'trainbench[gpu]')")
        return None
    try:
        pynvml.nvmlInit()
    except Exception as err:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded...
        missing.append(f"{what}: no NVIDIA GPU (NVML did not start: {err})")
        return None
    return pynvml


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml(missing: list[str], what: str, call, *args):
    """One NVML query; None (and a line in `missing`) where the GPU or driver lacks it."""
    try:
        return call(*args)
    except Exception as err:  # noqa: BLE001 - NVMLError_NotSupported and friends
        missing.append(f"{what}: {err}")
        return None


def gpu_info(nvml, missing: list[str]) -> list[dict]:
    driver = _nvml(missing, "gpu driver", nvml.nvmlSystemGetDriverVersion)
    count = _nvml(missing, "gpus", nvml.nvmlDeviceGetCount) or 0
    if count == 0:
        missing.append("gpus: NVML sees no GPU")
    gpus = []
    for index in range(count):
        tag = f"gpu {index}"
        h = _nvml(missing, tag, nvml.nvmlDeviceGetHandleByIndex, index)
        if h is None:
            continue

        def q(what, call, *args, h=h, tag=tag):
            return _nvml(missing, f"{tag} {what}", call, h, *args)
        mem = q("memory", nvml.nvmlDeviceGetMemoryInfo)
        limit = q("power limit", nvml.nvmlDeviceGetEnforcedPowerLimit)
        ecc = q("ecc mode", nvml.nvmlDeviceGetEccMode)
        persistence = q("persistence mode", nvml.nvmlDeviceGetPersistenceMode)
        mig = q("mig mode", nvml.nvmlDeviceGetMigMode)
        gpus.append({
            "index": index,
            "name": _text(q("name", nvml.nvmlDeviceGetName)),
            "uuid": _text(q("uuid", nvml.nvmlDeviceGetUUID)),
            "memory_bytes": int(mem.total) if mem is not None else None,
            "driver": _text(driver) if driver is not None else None,
            "sm_clock_mhz": q("sm clock", nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM),
            "sm_clock_max_mhz": q("sm max clock", nvml.nvmlDeviceGetMaxClockInfo,
                                  nvml.NVML_CLOCK_SM),
            "mem_clock_mhz": q("memory clock", nvml.nvmlDeviceGetClockInfo,
                               nvml.NVML_CLOCK_MEM),
            "mem_clock_max_mhz": q("memory max clock", nvml.nvmlDeviceGetMaxClockInfo,
                                   nvml.NVML_CLOCK_MEM),
            "power_limit_w": limit / 1000 if limit is not None else None,  # NVML gives mW
            # (current, pending) pairs: the current mode is what this run had
            "ecc": bool(ecc[0]) if ecc is not None else None,
            "persistence": bool(persistence) if persistence is not None else None,
            "mig": bool(mig[0]) if mig is not None else None,
        })
    return gpus


def topology(missing: list[str]) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        missing.append("topology: nvidia-smi not on PATH")
        return None
    try:
        done = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as err:
        missing.append(f"topology: nvidia-smi topo -m failed: {err}")
        return None
    if done.returncode != 0:
        missing.append(f"topology: nvidia-smi topo -m exited {done.returncode}: "
                       f"{done.stderr.strip()[:200]}")
        return None
    return done.stdout


# --- all of it --------------------------------------------------------------------------

def collect(rank_threads: int | None = None,
            environ: Mapping[str, str] | None = None) -> dict:
    """The run's conditions on this node (the schema in issue #17 / README).

    rank_threads: the intra-op threads of one rank (torch.get_num_threads() by default).
    Never raises for something it cannot read: that goes into `missing`, with why.
    """
    missing: list[str] = []
    if rank_threads is None:
        try:
            import torch  # torch stays out of the CLI's imports (`trainbench --help`)
            rank_threads = torch.get_num_threads()
        except Exception:  # noqa: BLE001
            missing.append("cpu threads_per_rank: torch not importable")
    info: dict = {"schema": SCHEMA}
    info.update(versions(missing))
    uname = os.uname()
    info["host"] = {"hostname": socket.gethostname(),
                    "kernel": f"{uname.sysname} {uname.release} {uname.version}",
                    "os": os_name()}
    info["cpu"] = cpu_info(missing, rank_threads)
    info["memory_bytes"] = memory_bytes(missing)
    nvml = nvml_module(missing)
    info["gpus"], info["topology"] = [], None
    if nvml is not None:
        try:
            info["gpus"] = gpu_info(nvml, missing)
        finally:
            nvml.nvmlShutdown()
        if info["gpus"]:
            info["topology"] = topology(missing)
    if not info["gpus"] and not any(m.startswith("topology") for m in missing):
        missing.append("topology: no GPU, so no GPU/NIC topology")
    info["slurm"] = slurm_facts(environ)
    info["env"] = recorded_env(environ)
    info["missing"] = missing
    return info
