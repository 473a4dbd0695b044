"""trainbench vs the obvious alternative: a plain Hugging Face LlamaForCausalLM + AdamW loop.

Same tiny Llama 3.1 config, same global batch (8 x 128 tokens in microbatches of 2),
same dtype, same machine, same run. trainbench runs through its real CLI (torchrun, one
rank); the baseline is a hand-written loop. Both report tokens/s over the seeds' step
window (iterations 11-44 of 50 by default, scaled to --steps).

    python bench/cpu_throughput.py [--steps 50] [--dtype fp32|bf16|all]

It prints the machine (CPU model, cores, native bf16 or not, torch version, load) with
its table, so a figure always says where it came from. Both loops make a step's batches
before starting its timer, as trainbench's trainer does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from trainbench.catalog.models import get_model
from trainbench.engine import data
from trainbench.metrics import default_window
from trainbench.planning import build_plan


def trainbench_step_times(steps: int, dtype: str) -> list[float]:
    with tempfile.TemporaryDirectory() as root:
        env = dict(os.environ, TRAINBENCH_ROOT=root)
        cmd = [sys.executable, "-m", "trainbench.cli", "run", "-w", "pretrain_llama3.1", "-s",
               "tiny", "--dtype", dtype, "--scale", "1", "--gpu", "cpu", "--steps", str(steps)]
        subprocess.run(cmd, check=True, env=env, capture_output=True)
        (metrics,) = Path(root).glob("experiments/*/*/metrics.jsonl")
        return [json.loads(line)["step_time_s"] for line in metrics.read_text().splitlines()]


def hf_step_times(steps: int, dtype: str) -> list[float]:
    from transformers import LlamaConfig, LlamaForCausalLM
    plan = build_plan("pretrain_llama3.1", "tiny", dtype, 1, "cpu")
    spec = get_model("pretrain_llama3.1", "tiny")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    config = LlamaConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden, intermediate_size=spec.ffn,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim, rms_norm_eps=spec.norm_eps,
        rope_theta=spec.rope_base, max_position_embeddings=spec.seq_len,
        tie_word_embeddings=False, attn_implementation="sdpa",
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=plan.lr, betas=(0.9, 0.95), weight_decay=0.1)
    times = []
    for step in range(steps):
        batches = [data.microbatch(plan.seed, step, first, plan.mbs, plan.seq_len,
                                   spec.vocab_size) for first in range(0, plan.gbs, plan.mbs)]
        t0 = time.perf_counter()
        for inputs, labels in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                logits = model(input_ids=inputs).logits
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                                     labels.flatten(0, 1))
            (loss / plan.ga).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times


def window_mean(times: list[float]) -> float:
    start, end = default_window(len(times))
    return statistics.fmean(times[start:end + 1])


def machine_line() -> str:
    """CPU model, cores, native bf16, torch version and load: where the figures come from."""
    from trainbench.default_dtype import native_bf16_flags, read_cpuinfo
    info = read_cpuinfo()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                  if line.startswith("model name")), "unknown CPU")
    flags = native_bf16_flags(info)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"machine: {model}, {cores} cores, "
            f"{'native bf16 (' + ', '.join(flags) + ')' if flags else 'no native bf16'}, "
            f"torch {torch.__version__}, "
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; "
            f"load average before the run {load}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--dtype", default="all", choices=("fp32", "bf16", "all"))
    args = parser.parse_args()
    tokens = 8 * 128
    print(machine_line())
    print(f"tiny Llama 3.1, GBS 8 x 128 tokens, {args.steps} steps, window "
          f"{'-'.join(map(str, default_window(args.steps)))}; trainbench: torchrun, 1 rank")
    print("| dtype | trainbench | Hugging Face loop | ratio |")
    print("|---|---|---|---|")
    for dtype in (("fp32", "bf16") if args.dtype == "all" else (args.dtype,)):
        tb = window_mean(trainbench_step_times(args.steps, dtype))
        hf = window_mean(hf_step_times(args.steps, dtype))
        print(f"| {dtype} | {tb * 1e3:.1f} ms/step, {tokens / tb:,.0f} tokens/s | "
              f"{hf * 1e3:.1f} ms/step, {tokens / hf:,.0f} tokens/s | {hf / tb:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
