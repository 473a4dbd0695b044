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


@pytest.mark.slow
@pytest.mark.parametrize("mode,shards", [("on", 1), ("off", 0)])
def test_gpu_mfu_one_rank_fsdp_forces_the_engines_choice(tmp_path, mode, shards):
    """--one-rank-fsdp on wraps a bf16 rank in FSDP (the engine's default runs it under
    autocast); off runs an FP8 rank under autocast (the default keeps FSDP for FP8). What
    the run really built is read back from its run.json, and its loss stays finite."""
    pytest.importorskip("torchao")
    out = tmp_path / "figures.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    dtype = "bf16" if mode == "on" else "fp8"
    res = subprocess.run([sys.executable, str(BENCH), "--steps", "1", "--warmup", "1",
                          "--dtypes", dtype, "--no-hf", "--one-rank-fsdp", mode,
                          "--json", str(out)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["dtype"] == dtype and row["fsdp_shards"] == shards
    assert 0 < row["loss"] < 20


@pytest.mark.slow
def test_fp8_linear_bench_runs_eager_on_a_cpu():
    """bench/fp8_linear.py on a CPU: the tiny block's linears in bf16 and both torchao FP8
    recipes, eager only, and it says no speed-up is measured."""
    pytest.importorskip("torchao")
    bench = BENCH.parent / "fp8_linear.py"
    res = subprocess.run([sys.executable, str(bench), "--iters", "1", "--warmup", "1"],
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = res.stdout.splitlines()
    for variant in ("bf16", "fp8 tensorwise", "fp8 rowwise"):
        (line,) = [ln for ln in lines if ln.startswith(f"{variant:<15} eager")]
        assert float(line.split()[-4]) > 0, line  # ms per pass
    assert not any("failed" in ln or "compiled" in ln for ln in lines)
    assert lines[-1] == "no GPU found: tiny CPU shape, FP8 emulated, no speed-up"


def test_kernels_are_sorted_into_kinds_by_name():
    """Kernel names from the H200 profile of 2026-11-28 (docs/gpu-runs/2026-11-28-h200/
    moe_235b_bf16.log), each under the kind the profile's summary charges it to."""
    sys.path.insert(0, str(BENCH.parent))
    import gpu_mfu
    named = {
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": "gemm",
        "_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kernel_for_sm9xINS_4gemm6k"
        "ernel13GemmUniversalINS5_17GroupProblemShape": "gemm",
        "triton_tem_fused_mm_1": "gemm",
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26": "attention",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(an"
        "onymous namespace)::FusedOptimizerTensorListMetadata<4>, at::native::(anonymous "
        "namespace)::FusedAdamMathFunctor<float, 4": "optimizer",
        "triton_poi_fused_index_put_new_zeros_5": "triton fused",
        "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda"
        "(at::TensorIteratorBase&)": "copy or cast",
        "void at::native::indexFuncLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, "
        "true, at::native::(anonymous namespace)::ReduceAdd>": "index, sort, scatter",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>"
        ", std::array<char*, 3ul> >": "elementwise",
        "ncclDevKernel_AllGather_RING_LL": "communication",
    }
    for name, kind in named.items():
        assert gpu_mfu.kernel_kind(name) == kind, name


def test_annotations_are_not_kernels():
    """A real profile's labelled spans (record_function, as the optimizer and FSDP label
    theirs) are annotations; the operators under them are not."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    sys.path.insert(0, str(BENCH.parent))
    import gpu_mfu

    spans = ("Optimizer.step#AdamW.step", "FSDP::post_backward_reduce (layers.1)")
    x = torch.ones(8, 8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for span in spans:
            with record_function(span):
                x = x @ x
    events = {e.key: e for e in prof.key_averages()}
    for span in spans:
        assert gpu_mfu.is_annotation(events[span]), span
    assert not gpu_mfu.is_annotation(events["aten::mm"])
