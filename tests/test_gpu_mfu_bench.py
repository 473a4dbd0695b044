"""bench/gpu_mfu.py, the GPU acceptance bench (issue 19, item 5), on this machine's CPU:
with no GPU it must say so, run the tiny shape through trainbench's engine and the Hugging
Face loop, and print their tokens/s and no MFU. bf16 only: fp8 takes the same code path
with another plan, and its torchao import alone would add seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gpu_mfu.py"


@pytest.mark.slow
def test_gpu_mfu_bench_runs_the_tiny_cpu_shape_and_prints_no_mfu(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "figures.json"
    # One thread: on a shared 2-core machine two threads per process slow a tiny loop
    # by 10x whenever another job takes a core (README, "Against the obvious alternative").
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, str(BENCH), "--steps", "1", "--warmup", "1",
                          "--dtypes", "bf16", "--json", str(out)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = res.stdout.splitlines()
    assert "no GPU found: tiny CPU shape, no MFU" in lines
    assert any(line.startswith("shape: Llama 3.1 hidden 64,") and "2 layers, seq 128" in line
               for line in lines)
    figures = json.loads(out.read_text())
    assert figures["gpu"] is False
    rows = {(r["run"], r["dtype"]): r for r in figures["rows"]}
    assert set(rows) == {("trainbench", "bf16"), ("HF LlamaForCausalLM", "bf16")}
    for (run, dtype), r in rows.items():
        assert r["tokens_per_s"] > 0 and r["tokens_per_s"] == pytest.approx(128 / r["step_time_s"])
        assert r["mfu_published_pct"] is None and r["mfu_causal_pct"] is None
        assert r["sdpa_backend"] == "flash (CPU, causal)"
        assert r["top_ops"], (run, dtype)
        # The table row carries the same tokens/s and a dash for each MFU and the peak.
        row = next(line for line in lines if line.startswith(f"| {run} | {dtype} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[3] == f"{r['tokens_per_s']:,.0f}" and cells[5] == cells[7] == cells[8] == "-"
    assert any(line.startswith("trainbench / HF tokens/s (bf16):") for line in lines)
    assert any(line.startswith("predict, trainbench bf16: no prediction") for line in lines)
