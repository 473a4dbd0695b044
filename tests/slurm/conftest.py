"""A real single-node Slurm for the tests in this directory.

The session fixture starts munged, slurmctld and slurmd with .ci/slurm-up.sh (see
../shared/reference/slurm-single-node.md) and, where slurmdbd and mariadb-server are
installed, MariaDB and slurmdbd for real accounting (sacct); it stops what it started at
the end. Where slurm-wlm (or, for the accounting tests, slurmdbd) is not installed, or
not as root, the tests skip with the reason; with CI=true they fail instead, because CI
must prove the Slurm path on a real cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SLURM_DIR = Path(os.environ.get("TRAINBENCH_SLURM_DIR", "/tmp/trainbench-slurm"))
DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "sinfo", "scontrol")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def unavailable(reason: str):
    if in_ci():
        pytest.fail(f"{reason}; CI=true, so the Slurm tests must run, not skip", pytrace=False)
    pytest.skip(reason)


@dataclass(frozen=True)
class SlurmCluster:
    conf: Path
    """slurm.conf; SLURM_CONF points here for the whole session."""
    slurmd_log: Path
    accounting: bool
    """Whether jobs are accounted in slurmdbd, so that sacct answers."""


def _config_value(key: str) -> str:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                         timeout=30).stdout
    for line in out.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == key:
            return value.strip()
    return ""


@pytest.fixture(scope="session")
def slurm_cluster():
    missing = [p for p in DAEMONS if not Path(p).exists()]
    missing += [c for c in CLIENTS if shutil.which(c) is None]
    if missing:
        unavailable(f"Slurm is not installed (missing {', '.join(missing)}); "
                    "install it with: apt-get install -y slurm-wlm munge")
    if os.geteuid() != 0:
        unavailable("a test Slurm needs root (slurmd starts jobs as any user)")
    proc = subprocess.run([str(REPO / ".ci" / "slurm-up.sh"), str(SLURM_DIR)],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        # Installed but broken is a failure everywhere, not a reason to skip.
        pytest.fail(f".ci/slurm-up.sh failed ({proc.returncode}):\n{proc.stderr}", pytrace=False)
    started_here = "already up" not in proc.stderr
    conf = proc.stdout.strip().splitlines()[-1].removeprefix("export SLURM_CONF=")
    patch = pytest.MonkeyPatch()
    patch.setenv("SLURM_CONF", conf)
    try:
        yield SlurmCluster(conf=Path(conf), slurmd_log=Path(_config_value("SlurmdLogFile")),
                           accounting=_config_value("AccountingStorageType")
                           == "accounting_storage/slurmdbd")
    finally:
        patch.undo()
        if started_here:
            subprocess.run([str(REPO / ".ci" / "slurm-down.sh"), str(SLURM_DIR)],
                           capture_output=True, timeout=60)


@pytest.fixture
def slurm_root(slurm_cluster, tmp_path, monkeypatch):
    """An experiments root and cluster config of its own for one test (partition debug)."""
    import yaml
    config = tmp_path / "cluster.yaml"
    config.write_text(yaml.safe_dump({"slurm": {"partition": "debug"}, "gpu_type": "cpu"}))
    monkeypatch.setenv("TRAINBENCH_ROOT", str(tmp_path))
    monkeypatch.setenv("TRAINBENCH_CONFIG", str(config))
    for var in ("TRAINBENCH_FAIL_AT_STEP", "TRAINBENCH_FAIL_RANK"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


@pytest.fixture(scope="session")
def slurm_accounting(slurm_cluster):
    """The cluster, with accounting up: sacct answers from slurmdbd."""
    if not slurm_cluster.accounting:
        configured = _config_value("AccountingStorageType") or "unknown"
        if all(Path(p).exists() for p in ("/usr/sbin/slurmdbd", "/usr/sbin/mariadbd")):
            # Installed but not enabled is a broken bring-up, here as in CI.
            pytest.fail(f"slurmdbd and mariadbd are installed but the cluster runs without "
                        f"accounting (AccountingStorageType={configured}); see "
                        f".ci/slurm-up.sh", pytrace=False)
        unavailable(f"Slurm accounting is off (AccountingStorageType={configured}); "
                    "install it with: apt-get install -y slurmdbd mariadb-server")
    proc = subprocess.run(["sacct", "-n", "-X", "-o", "JobID", "--starttime=now"],
                          capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        pytest.fail(f"accounting is configured but sacct fails: {proc.stderr.strip()}",
                    pytrace=False)
    return slurm_cluster
