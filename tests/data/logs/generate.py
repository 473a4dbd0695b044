"""Write the log fixtures of tests/test_results_*.py (deterministic; run from anywhere).

Each imitates one framework's output as the seeds show it, with the noise real logs
carry (NCCL INFO, warnings, progress bars) between the step lines. The step times sit
near the seeds' reference figures so the comparison has something to say.
`python tests/data/logs/generate.py` rewrites them in place.
"""

from __future__ import annotations

import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def nccl_noise(rng: random.Random, n: int) -> list[str]:
    ops = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast")
    return [f"node{rng.randint(1, 16):03d}:{rng.randint(1000, 9999)}:{rng.randint(1000, 9999)} "
            f"[{rng.randint(0, 7)}] NCCL INFO {rng.choice(ops)}: opCount {rng.randint(1, 999):x} "
            f"sendbuff 0x7ffb4713c200 recvbuff 0x7ffb4713c200 count {rng.randint(1, 10**6)} "
            f"datatype 1 op 0 root 0 comm 0x55556b100660 [nranks=128] stream 0x5555630c58b0"
            for _ in range(n)]


NEMO_STARTUP = [
    "[NeMo W 2025-04-11 14:30:02 nemo_logging:405] Could not import modelopt: "
    "ModuleNotFoundError: No module named 'modelopt'",
    "GPU available: True (cuda), used: True",
    "TPU available: False, using: 0 TPU cores",
    "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0,1,2,3,4,5,6,7]",
    "NCCL INFO NCCL_ASYNC_ERROR_HANDLING set by environment to 1",
    "[NeMo I 2025-04-11 14:30:40 nemo_logging:393] Setting up ModelTransform for stage: "
    "TrainerFn.FITTING",
    "  | Name   | Type     | Params | Mode",
    "  0 | module | GPTModel | 1.0 B  | train",
]


def step_times(rng: random.Random, n: int, first: float, steady: float, jitter: float):
    """A slow first step, two settling steps, then steady times with small jitter."""
    times = []
    for i in range(n):
        if i == 0:
            times.append(first)
        elif i < 3:
            times.append(steady * (1.15 - 0.05 * i))
        else:
            times.append(round(steady + rng.uniform(-jitter, jitter), 3))
    return times


def nemo2_line(i, total, gbs, t, loss, peak, alloc, tflops=None, memory_keys=None):
    mk = memory_keys or ("peak_memory_usage", "memory_allocated")
    text = (f"Training epoch 0, iteration {i}/{total - 1} | lr: {7.496e-06 * (i + 1) / total:.4g} | "
            f"global_batch_size: {gbs} | global_step: {i} | {mk[0]}: {peak} | {mk[1]}: {alloc} | "
            f"reduced_train_loss: {loss:.4g} | train_step_timing in s: {t}")
    if tflops is not None:
        text += f" | TFLOPS_per_GPU: {tflops:.2f}"
    return text + f" | consumed_samples: {(i + 1) * gbs}"


def write(path: Path, lines: list[str], end: str = "\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + end)


def llama31_8b_nemo2() -> None:
    """A successful NeMo 2 run, Llama 3.1 8B BF16 on 8 GPUs (reference 12.27 s/step)."""
    rng = random.Random(1)
    name = "pretrain_llama3.1_8b_bf16_8"
    run = HERE / "nemo2" / "experiments" / name / f"{name}_1744400000" / name
    lines = NEMO_STARTUP + nccl_noise(rng, 40)
    for i, t in enumerate(step_times(rng, 50, 48.2, 12.40, 0.08)):
        lines.append(nemo2_line(i, 50, 128, t, 12.5 - 0.012 * i, 70833405952, 44271689728))
        lines += nccl_noise(rng, rng.randint(0, 3))
    lines.append("[NeMo I 2025-04-11 14:48:45 nemo_logging:393] Global Checkpoint Save : Rank: 0 "
                 ": Iteration: 50 : Start time: 1744408121.151s : Save duration: 4.389s")
    write(run / f"log-{name}.out", lines)
    write(run / f"sbatch_{name}.out", [
        "srun: job 1407993 queued and waiting for resources",
        "srun: job 1407993 has been allocated resources",
        "Experiment finished: SUCCEEDED"])


def llama31_70b_failed() -> None:
    """A NeMo 2 run that ran out of memory before its first step."""
    rng = random.Random(2)
    name = "pretrain_llama3.1_70b_bf16_64"
    run = HERE / "nemo2" / "experiments" / name / f"{name}_1744500000" / name
    lines = NEMO_STARTUP + nccl_noise(rng, 30) + [
        "Traceback (most recent call last):",
        '  File "/opt/NeMo/nemo/collections/llm/api.py", line 150, in pretrain',
        "    return train(model=model, data=data, trainer=trainer)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 3 has a "
        "total capacity of 79.11 GiB of which 1.02 GiB is free.",
        "srun: error: node007: task 3: Exited with exit code 1",
    ] + nccl_noise(rng, 5)
    write(run / f"log-{name}.out", lines)


def nemotronh_incomplete() -> None:
    """Nemotron-H 56B with the seed's experiment name, TFLOPS_per_GPU and
    max_memory_reserved/max_memory_allocated fields; it dies after iteration 37.
    The log prints the recipe's GBS for 128 GPUs (384; the seed's example name says
    gbs768, which is the 256-GPU batch)."""
    rng = random.Random(3)
    name = "pretrain_nemotronh_56b_fp8_gpus128_tp8_pp1_cp1_vpNone_mbs1_gbs768"
    run = HERE / "nemo2" / "experiments" / name / f"{name}_1750000000"
    lines = NEMO_STARTUP + nccl_noise(rng, 40)
    for i, t in enumerate(step_times(rng, 38, 95.0, 15.60, 0.9)):
        lines.append(nemo2_line(i, 50, 384, t, 11.0 - 0.02 * i, 76001337344, 51234567890,
                                tflops=532.4 * 15.86 / t,
                                memory_keys=("max_memory_reserved", "max_memory_allocated")))
        lines += nccl_noise(rng, rng.randint(0, 4))
    lines += [
        "[rank37]:[E411 15:02:11.000000000 ProcessGroupNCCL.cpp:616] [Rank 37] Watchdog caught "
        "collective operation timeout",
        "Traceback (most recent call last):",
        "torch.distributed.DistBackendError: NCCL communicator was aborted on rank 37.",
    ] + nccl_noise(rng, 3)
    write(run / f"log-{name}.out", lines)


def nemotron4_340b_nemo1() -> None:
    """NeMo 1 (NeMo Launcher) Nemotron-4 340B BF16 on 128 GPUs, 100 steps, the progress
    bar redrawn with carriage returns (reference 4.61 s/step, seed 000)."""
    rng = random.Random(4)
    run = HERE / "nemo1" / "results" / "24.11" / "bf16" / "340b" / "128"
    lines = NEMO_STARTUP + nccl_noise(rng, 20)
    total, gbs = 100, 32
    bar = []
    for i, t in enumerate(step_times(rng, total, 60.0, 4.70, 0.04)):
        done = i + 1
        filled = "█" * (done // 10)
        bar.append(f"Epoch 0: : {done}%|{filled:<10}| {done}/{total} [00:{i:02d}<00:00, "
                   f"reduced_train_loss={12.9 - 0.05 * i:.3f}, global_step={i}.00, "
                   f"consumed_samples={done * gbs}.0, train_step_timing in s={t:.3f}]")
        if i % 30 == 29:  # the bar shares its line with redraws; warnings break it up
            lines.append("\r".join(bar))
            lines.append("[NeMo W 2025-04-11 15:00:00 nemo_logging:405] UserWarning: "
                         "The progress bar already tracks a metric with the name(s)")
            bar = []
    lines.append("\r".join(bar))
    lines.append("`Trainer.fit` stopped: `max_steps=100` reached.")
    write(run / "log-nemo-megatron-nemotron4_340b_128_1359101.out", lines)


def llama2_70b_maxtext() -> None:
    """MaxText Llama 2 70B BF16 on 64 GPUs (reference 6.999 s/step), its config printed
    first (`Config param steps: 50`), then `completed step:` lines."""
    rng = random.Random(5)
    run = HERE / "maxtext" / "results" / "24.12" / "bf16" / "70b" / "64"
    lines = [
        "I1209 10:00:00.000000 140000000000000 xla_bridge.py:884] Unable to initialize backend "
        "'rocm': module 'jaxlib.xla_extension' has no attribute 'GpuAllocatorConfig'",
        "Config param dtype: bfloat16",
        "Config param global_batch_size_to_train_on: 128",
        "Config param max_target_length: 4096",
        "Config param per_device_batch_size: 2",
        "Config param steps: 50",
        "System Information: Jax Version: 0.4.37",
    ] + nccl_noise(rng, 20)
    for i, t in enumerate(step_times(rng, 50, 60.0, 7.62, 0.03)):
        tflops = 989 * 0.5259 * 6.999 / t
        lines.append(f"completed step: {i}, seconds: {t:.3f}, TFLOP/s/device: {tflops:.3f}, "
                     f"Tokens/s/device: {4096 * 2 / t:.3f}, total_weights: 524288, loss: 0.000")
        lines += nccl_noise(rng, rng.randint(0, 2))
    write(run / "log-maxtext-64_70b_1407993.out", lines)


def megatron_bridge_20() -> None:
    """Megatron-Bridge Llama 3.1 8B FP8 on 8 GPUs (reference 9.33 s/step), 20 iterations
    (1-based), TFLOPS on a separate `Step Time` line printed before each iteration line,
    and a `memory (MB)` report. Its name says nothing: tests give -w/-s/--dtype/--scale."""
    rng = random.Random(6)
    lines = nccl_noise(rng, 10)
    for it, t in enumerate(step_times(rng, 20, 30.0, 9.41, 0.02), start=1):
        tflops = 128 * 4.74e14 / t / 8 / 1e12
        lines.append(f"llama31_8b_fp8/0 Step Time : {t:.2f}s GPU utilization: {tflops:.1f}"
                     "MODEL_TFLOP/s/GPU")
        lines.append(f"llama31_8b_fp8/0  [2025-12-22 15:18:33] iteration {it:8d}/{20:8d} | "
                     f"consumed samples: {it * 128:12d} | elapsed time per iteration (ms): "
                     f"{t * 1000:.1f} | learning rate: 3.000000E-05 | global batch size: {128:5d} | "
                     f"lm loss: {8.5 - 0.02 * it:.6E} | loss scale: 1.0 | grad norm: "
                     f"{0.05 + 0.001 * it:.3f} | number of skipped iterations:   0 | "
                     "number of nan iterations:   0 |")
        if it == 1:
            lines.append("[Rank 0] (after 1 iterations) memory (MB) | allocated: 41234.5 | "
                         "max allocated: 60123.2 | reserved: 65000.0 | max reserved: 71234.0")
        lines += nccl_noise(rng, rng.randint(0, 2))
    write(HERE / "megatron" / "megatron-bridge-llama3-8b.log", lines)


if __name__ == "__main__":
    llama31_8b_nemo2()
    llama31_70b_failed()
    nemotronh_incomplete()
    nemotron4_340b_nemo1()
    llama2_70b_maxtext()
    megatron_bridge_20()
