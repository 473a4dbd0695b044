#!/usr/bin/env bash
# Every one-GPU check of the README's "On a GPU" section in one call, logs into OUT_DIR:
# the acceptance bench (bf16, fp8, the Hugging Face loop), the like-for-like FP8 runs, one
# block's linears in bf16 and FP8, the smoke runs through `trainbench run` on all local
# GPUs, and a probe of one GPU. About 4 minutes on one H100 (2026-11-26). Each step has
# its own time limit, so one that hangs does not take the others with it.
#
#   bash bench/gpu_checks.sh OUT_DIR        (PYTHONPATH=src, or trainbench installed)
set -u
out=${1:?usage: bash bench/gpu_checks.sh OUT_DIR}
mkdir -p "$out"
py=${PYTHON:-python3}
step() {  # step NAME SECONDS COMMAND...: run it, log it, keep going whatever it returns
  local name=$1 limit=$2; shift 2
  echo "== $name ($(date -u +%H:%M:%S))"
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  echo "   exit $? -> $out/$name.log"
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv
  "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  "$py" -c "import torchao; print('torchao', torchao.__version__)" || true
} > "$out/env.log" 2>&1
step gpu_mfu 300 "$py" bench/gpu_mfu.py --json "$out/gpu_mfu.json"
step gpu_mfu_one_rank_fsdp_on 180 "$py" bench/gpu_mfu.py --dtypes bf16,fp8 --no-hf --one-rank-fsdp on
step gpu_mfu_one_rank_fsdp_off 180 "$py" bench/gpu_mfu.py --dtypes bf16,fp8 --no-hf --one-rank-fsdp off
step fp8_linear 180 "$py" bench/fp8_linear.py
step gpu_smoke 400 "$py" bench/gpu_smoke.py --steps 10 --root "$out/smoke"
step probe 180 "$py" -m trainbench.cli probe --scale 1 --root "$out/probe"
