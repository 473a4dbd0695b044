"""torchao is optional (FP8 runs only) and mamba_ssm too: importing the engine, as every
rank of a bf16 run does, must not import torchao, whose import alone prints a warning
per CUDA kernel it cannot load on a CPU and which a GPU image may not have."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")


def test_the_engine_starts_without_importing_torchao():
    probe = ("import sys, trainbench.engine.__main__, trainbench.engine.trainer, "
             "trainbench.check.build; print(sorted(m for m in ('torchao', 'mamba_ssm') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    assert "Failed to load" not in out.stderr
