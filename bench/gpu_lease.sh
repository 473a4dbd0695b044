#!/usr/bin/env bash
# The next GPU checks, sized for one short lease of one GPU (about 9 minutes of command
# time): each step under its own time limit and never past the lease's budget, the logs
# packed into OUT_DIR after every step, so a lease that ends early still returns what
# ran. Highest value first: the FP8 proxies' kernel breakdowns (where predict still misses
# 13-29%: FSDP's float8 all-gather casts, torchao's eager passes), the cast rates and a
# probe on this GPU type (the H200's probe timed attention at 188 TFLOPS where the MoE
# proxies' own cuDNN kernels ran at 360-450), then the accept rows no GPU has run and the
# allocator's reserve with expandable segments. One
# process per dtype: compiling two proxies in one process ran past 130 s on the H200.
# bench/gpu_checks.sh is the unhurried version.
#
#   BUDGET=540 bash bench/gpu_lease.sh OUT_DIR    (PYTHONPATH=src, or trainbench installed)
# torchao travels as a wheel: docs/gpu-acceptance.md, "Bringing torchao".
set -u
out=${1:?usage: bash bench/gpu_lease.sh OUT_DIR}
py=${PYTHON:-python3}
start=$(date +%s); deadline=$((start + ${BUDGET:-540}))
work=$(mktemp -d); summary=$work/summary.txt
mkdir -p "$out"
pack() {  # two files back: the summary, and every log (profiler traces left out)
  tar czf "$out/logs.tgz" -C "$work" --exclude='*.pt.trace.json*' --exclude='*.json.gz' \
      --exclude='*.distcp' --exclude='*.pt' . 2>/dev/null
  cp "$summary" "$out/summary.txt"
}
step() {  # step NAME SECONDS COMMAND...: within what is left of the budget, then pack
  local name=$1 limit=$2; shift 2
  local left=$((deadline - $(date +%s)))
  if [ "$left" -lt 40 ]; then echo "skipped $name: ${left}s left" >> "$summary"; pack; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name at +$(( $(date +%s) - start ))s, limit ${limit}s: $*" >> "$summary"
  # 20 s after the SIGTERM: `accept` stops its running command (SIGTERM, 15 s, SIGKILL)
  # before it exits, so nothing of one step shares the GPU with the next.
  timeout -k 20 "$limit" "$@" > "$work/$name.log" 2>&1
  echo "   $name exit $? at +$(( $(date +%s) - start ))s" >> "$summary"
  pack
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
  "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  "$py" -c "import torchao; print('torchao', torchao.__version__)" || true
} >> "$summary" 2>&1
step import_all 60 "$py" bench/import_all.py
moe="$py bench/gpu_moe.py --steps 3 --warmup 2 --no-layer --top 40"
step moe_dsv3_fp8 110 $moe --proxies deepseek-v3 --dtypes fp8 --json "$work/moe_dsv3_fp8.json"
# Nemotron-H's FP8 proxy ran slower than its bf16 one (563 against 491 ms), unprofiled:
# where its step goes, kernel by kernel (steps 4-5 profiled, the log's top operators).
step nemotronh_fp8_profile 100 "$py" -m trainbench.cli run -w pretrain_nemotronh -s 56b \
    --dtype fp8 --scale 1 --gpu h200 --steps 7 --profile torch --profile-steps 4-5 \
    --set "layers=3 mbs=1 gbs=2 tp=1 pp=1 cp=1 dp=1" --root "$work/nemotronh_fp8_profile"
step moe_235b_fp8 110 $moe --proxies qwen3-235b --dtypes fp8 --json "$work/moe_235b_fp8.json"
step cast_rates 60 "$py" bench/cast_rates.py
step probe 90 "$py" -m trainbench.cli probe --scale 1 --root "$work/probe"
step accept_fp8 200 "$py" -m trainbench.cli accept --only nemotronh-fp8,llama2-fp8,nemotron4-fp8 \
    --steps 6 --time-limit 65 --out "$work/accept_fp8"
# Ranks now run with expandable segments (launch/rank_env.py): the same row as the
# 2026-11-28 lease's, whose reserved peak was 81.32 GiB for 72.39 allocated without them.
step allocator_on 70 "$py" -m trainbench.cli accept --only nemotron4-bf16 --steps 4 \
    --time-limit 60 --out "$work/allocator_on"
step accept_rest 150 "$py" -m trainbench.cli accept --only llama3.1-bf16,deepseek_v3-fp8 \
    --steps 6 --time-limit 70 --out "$work/accept_rest"
echo "done at +$(( $(date +%s) - start ))s" >> "$summary"; pack
