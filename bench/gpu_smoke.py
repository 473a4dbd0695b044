"""GPU smoke benchmark: Llama 3.1 8B with a few layers on this machine's GPUs.

For a session (or a user) with an NVIDIA GPU at hand: runs the real engine through
`trainbench run` (NCCL, flash SDPA, bf16, and FP8 when torchao is installed) on one GPU
and, with more than one, on all of them as FSDP data parallel; prints step time,
tokens/s, TFLOPS/GPU, MFU and peak memory next to what `trainbench predict` expected
for the same plan. Needs no network; writes its experiments under --root.

    python bench/gpu_smoke.py [--layers 4] [--steps 30] [--root /tmp/tb-smoke]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def run(root: Path, dtype: str, gpus: int, layers: int, steps: int, tp: int = 1) -> Path | None:
    settings = (f"layers={layers} tp={tp} cp=1 pp=1 dp={gpus // tp} mbs=1 "
                f"gbs={8 * gpus // tp}")
    cmd = [sys.executable, "-m", "trainbench.cli", "run", "-w", "pretrain_llama3.1", "-s", "8b",
           "--dtype", dtype, "--scale", str(gpus), "--steps", str(steps), "--set", settings,
           "--root", str(root)]
    print("$", " ".join(cmd), flush=True)
    before = set(root.glob("experiments/*/*"))
    res = subprocess.run(cmd, capture_output=True, text=True)
    new = sorted(set(root.glob("experiments/*/*")) - before)
    if res.returncode != 0:
        print(res.stdout[-2000:], res.stderr[-2000:], sep="\n")
    return new[0] if new else None


def predicted_step_time(exp: Path) -> float | None:
    from trainbench.planning import load_plan
    from trainbench.predict.perf import predict_step
    try:
        return predict_step(load_plan(exp / "plan.json"), sharding="engine").step_time_s
    except Exception as err:  # noqa: BLE001 - a benchmark reports, it does not stop
        print(f"(no prediction: {err})")
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--root", type=Path, default=Path("/tmp/trainbench-gpu-smoke"))
    args = parser.parse_args()
    from trainbench.launch.request import gpu_names
    n = len(gpu_names())
    if n == 0:
        sys.exit("gpu_smoke: no NVIDIA GPU here (nvidia-smi finds none)")
    dtypes = ["bf16"]
    try:
        import torchao  # noqa: F401
        dtypes.append("fp8")
    except ImportError:
        print("torchao not installed: FP8 skipped (pip install 'trainbench[fp8]')")
    from trainbench.catalog.hardware import gpu_from_device_name
    gpu = gpu_from_device_name(gpu_names()[0])
    if "fp8" in dtypes and gpu is not None and gpu.peak("mxfp8"):
        dtypes.append("mxfp8")  # Blackwell: MXFP8 through torchao's MX kernels
    from trainbench.results import summarize_experiment
    rows = []
    # FP8 on all GPUs: FSDP2's float8 all-gather (NCCL only); with TP2, torchao's Float8
    # TP styles (FP8 sequence-parallel traffic). Each run's run.json says what ran.
    runs = [(dtype, gpus, 1) for dtype in dtypes for gpus in sorted({1, n})]
    if n >= 2 and "fp8" in dtypes:
        runs.append(("fp8", n, 2))
    for run_dtype, gpus, tp in runs:
        exp = run(args.root, run_dtype, gpus, args.layers, args.steps, tp)
        dtype = run_dtype if tp == 1 else f"{run_dtype}/tp{tp}"
        if exp is None:
            rows.append((dtype, gpus, "no experiment", None, None))
            continue
        fp8 = json.loads((exp / "run.json").read_text()).get("fp8") \
            if (exp / "run.json").exists() else None
        if fp8:
            print(f"  fp8: recipe {fp8['recipe']}, FSDP float8 all-gather "
                  f"{fp8['fsdp_float8_all_gather']}, Float8 TP styles "
                  f"{fp8.get('float8_tp_styles')}, {fp8['float8_linears']} FP8 linears",
                  flush=True)
        r = summarize_experiment(exp)
        device = json.loads((exp / "run.json").read_text()).get("device_name", "?") \
            if (exp / "run.json").exists() else "?"
        rows.append((dtype, gpus, device, r, predicted_step_time(exp)))
    print(f"\nLlama 3.1 8B with {args.layers} layers, seq 8192, MBS 1, 8 sequences per GPU, "
          f"{args.steps} steps")
    print(f"{'dtype':<6}{'GPUs':>5}  {'device':<28}{'status':<11}{'step s':>9}{'pred s':>9}"
          f"{'tokens/s':>11}{'TFLOPS/GPU':>11}{'MFU':>8}{'peak GiB':>9}")
    for dtype, gpus, device, r, pred in rows:
        if r is None:
            print(f"{dtype:<6}{gpus:>5}  {device}")
            continue
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        print(f"{dtype:<6}{gpus:>5}  {device[:27]:<28}{r.status:<11}"
              f"{fmt(r.step_time_mean_s, '.3f'):>9}{fmt(pred, '.3f'):>9}"
              f"{fmt(r.tokens_per_s, ',.0f'):>11}{fmt(r.tflops_per_gpu, '.1f'):>11}"
              f"{'INVALID' if r.mfu_problem else fmt(r.mfu_pct, '.1f') + '%':>8}"
              f"{fmt(r.peak_memory_gib, '.1f'):>9}")
        if r.mfu_problem:
            print(f"      {r.mfu_problem}")


if __name__ == "__main__":
    main()
