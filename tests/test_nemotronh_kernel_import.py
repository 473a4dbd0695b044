"""The Mamba-2 mixer finds mamba_ssm's Triton SSD kernel in a wheel built without the
package's CUDA extension (MAMBA_SKIP_CUDA_BUILD=TRUE; PyPI has mamba-ssm's source only),
whose `__init__` fails on `import selective_scan_cuda`; and falls back to the torch scan,
leaving no half-imported package, where the kernel itself cannot load (no Triton).

A stand-in package with mamba-ssm 2.3.2's layout plays the wheel: the real one needs
Triton, which a CPU build of torch lacks."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.dist  # a fresh interpreter per case: imports are process-wide

PROBE = """
import sys
from trainbench.engine.models import mamba2
kernel = mamba2.mamba_chunk_scan_combined
print(kernel() if kernel else None, sorted(m for m in sys.modules if m.startswith("mamba_ssm")))
"""


def _package(root, ssd_combined: str) -> None:
    pkg = root / "mamba_ssm"
    (pkg / "ops" / "triton").mkdir(parents=True)
    # As mamba-ssm 2.3.2: __init__ -> ops.selective_scan_interface -> the CUDA extension.
    (pkg / "__init__.py").write_text(
        "from mamba_ssm.ops.selective_scan_interface import selective_scan_fn\n")
    (pkg / "ops" / "__init__.py").write_text("")
    (pkg / "ops" / "selective_scan_interface.py").write_text(
        "import selective_scan_cuda\nselective_scan_fn = None\n")
    (pkg / "ops" / "triton" / "__init__.py").write_text("")
    (pkg / "ops" / "triton" / "ssd_combined.py").write_text(ssd_combined)


def _probe(root) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), *sys.path]))
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_the_kernel_loads_from_a_wheel_without_the_cuda_extension(tmp_path):
    _package(tmp_path, "def mamba_chunk_scan_combined():\n    return 'ssd kernel'\n")
    assert _probe(tmp_path) == ("ssd kernel ['mamba_ssm', 'mamba_ssm.ops', "
                                "'mamba_ssm.ops.triton', 'mamba_ssm.ops.triton.ssd_combined']")


def test_without_triton_the_torch_scan_runs_and_no_package_is_left_behind(tmp_path):
    _package(tmp_path, "import triton_that_is_not_here\n"
                       "def mamba_chunk_scan_combined():\n    return 'ssd kernel'\n")
    assert _probe(tmp_path) == "None []"
