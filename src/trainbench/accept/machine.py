"""The machine an acceptance run measures: its GPU (or none), driver and the versions
of torch and torchao, found without importing torch (nvidia-smi and package metadata)."""

from __future__ import annotations

import importlib.util
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass
from importlib import metadata

from .. import version as package_version
from ..catalog import hardware
from ..conditions import cpu_info
from ..launch.request import gpu_names


@dataclass(frozen=True)
class Machine:
    device: str
    """The GPU's name as the driver gives it, or the CPU's."""
    gpu_key: str
    """The catalog's GPU type ('h100', ...), 'cpu', or '' for a GPU the catalog lacks."""
    gpus: int
    driver: str | None
    torch: str | None
    torchao: str | None
    python: str
    trainbench: str | None

    @property
    def gpu(self) -> hardware.GPU | None:
        return hardware.GPUS.get(self.gpu_key)

    @property
    def on_cpu(self) -> bool:
        return self.gpu_key == hardware.CPU

    @property
    def kind(self) -> str:
        """'cpu' or 'gpu': what the defaults (steps, time limits) are chosen for."""
        return "cpu" if self.on_cpu else "gpu"

    def to_dict(self) -> dict:
        return asdict(self)


def _version(package: str) -> str | None:
    """An installed package's version, or None; a package whose files are gone (a
    half-removed install) counts as missing."""
    try:
        version = metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
    return version if importlib.util.find_spec(package) is not None else None


def _driver() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    return lines[0] if out.returncode == 0 and lines else None


def detect() -> Machine:
    names = gpu_names()
    if names:
        gpu = hardware.gpu_from_device_name(names[0])
        device, key = names[0], (gpu.key if gpu else "")
    else:
        device, key = cpu_info([])["model"] or "CPU", hardware.CPU
    return Machine(device=device, gpu_key=key, gpus=len(names), driver=_driver(),
                   torch=_version("torch"), torchao=_version("torchao"),
                   python=platform.python_version(), trainbench=package_version())
