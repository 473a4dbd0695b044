#!/usr/bin/env bash
# Every one-GPU check in one call, logs into OUT_DIR. First `trainbench accept` (every
# family's one-GPU proxy in bf16 and FP8 beside predict, a checkpoint save and resume, a
# profiled step, a probe: one table in OUT_DIR/accept/acceptance.md), then the benches
# it does not cover: trainbench against a Hugging Face loop (gpu_mfu.py), the
# like-for-like FP8 runs, one block's linears in bf16 and FP8, and, with more than one
# GPU, the smoke runs on all of them. Each step and each acceptance row has its own time
# limit, so one that hangs does not take the others with it.
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
step import_all 120 "$py" bench/import_all.py
step accept 1500 "$py" -m trainbench.cli accept --out "$out/accept"
step gpu_mfu 300 "$py" bench/gpu_mfu.py --json "$out/gpu_mfu.json"
step gpu_mfu_one_rank_fsdp_on 180 "$py" bench/gpu_mfu.py --dtypes bf16,fp8 --no-hf --one-rank-fsdp on
step gpu_mfu_one_rank_fsdp_off 180 "$py" bench/gpu_mfu.py --dtypes bf16,fp8 --no-hf --one-rank-fsdp off
step fp8_linear 180 "$py" bench/fp8_linear.py
if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -gt 1 ]; then
  step gpu_smoke 400 "$py" bench/gpu_smoke.py --steps 10 --root "$out/smoke"
fi
