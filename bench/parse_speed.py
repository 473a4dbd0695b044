"""How fast `trainbench results` streams a huge log, against `grep -c train_step_timing`.

Writes a log of at least 1 GB (NCCL INFO trace lines, the bulk of an NCCL-traced run,
with a 50-step NeMo 2 run's step lines spread through it) into a temporary directory,
times `trainbench results FILE --format json` and `grep -c 'train_step_timing' FILE` on
it in this same run, reports MB/s of each and the peak resident memory of the results
process (from wait4's rusage), then deletes the file. A benchmark, not a test:

    .venv/bin/python bench/parse_speed.py [--size-gb 1.0] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS = 50
BLOCK = 2**20


def noise_block(rng: random.Random) -> bytes:
    """About 1 MiB of NCCL trace lines, the way NCCL_DEBUG=INFO with the trace subsystem
    prints every collective."""
    ops = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Send", "Recv")
    lines = []
    size = 0
    while size < BLOCK:
        r = rng.randint
        line = (f"node{r(1, 256):03d}:{r(1000, 99999)}:{r(1000, 99999)} [{r(0, 7)}] NCCL INFO "
                f"{rng.choice(ops)}: opCount {r(1, 99999):x} sendbuff 0x7ffb{r(0, 2**32):08x} "
                f"recvbuff 0x7ffb{r(0, 2**32):08x} count {r(1, 10**8)} datatype {r(0, 9)} op 0 "
                f"root 0 comm 0x5555{r(0, 2**32):08x} [nranks=1024] stream 0x5555630c58b0\n")
        lines.append(line)
        size += len(line)
    return "".join(lines).encode()


def step_line(i: int, t: float) -> bytes:
    return (f"Training epoch 0, iteration {i}/{STEPS - 1} | lr: 7.496e-06 | "
            f"global_batch_size: 128 | global_step: {i} | peak_memory_usage: 70833405952 | "
            f"memory_allocated: 44271689728 | "
            f"reduced_train_loss: {12.5 - 0.01 * i:.2f} | train_step_timing in s: {t} | "
            f"consumed_samples: {128 * (i + 1)}\n").encode()


def generate(path: Path, size_bytes: int) -> int:
    """Write the log; returns its size. Step lines are spread evenly through the noise."""
    rng = random.Random(0)
    blocks = [noise_block(rng) for _ in range(8)]
    n_blocks = -(-size_bytes // BLOCK)
    every = max(1, n_blocks // STEPS)
    step = 0
    with open(path, "wb") as fh:
        for b in range(n_blocks):
            fh.write(blocks[b % len(blocks)])
            if b % every == every - 1 and step < STEPS:
                fh.write(step_line(step, 12.39 if step else 45.0))
                step += 1
        while step < STEPS:
            fh.write(step_line(step, 12.39))
            step += 1
    return path.stat().st_size


def timed(cmd: list[str]) -> tuple[float, int, str]:
    """(wall seconds, peak RSS bytes, stdout) of a child process, RSS from wait4."""
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    if proc.returncode not in (0, 1):  # grep -c exits 1 on no match
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{text[-2000:]}")
    return elapsed, usage.ru_maxrss * 1024, text  # Linux reports ru_maxrss in KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="log size in GB (1e9 bytes)")
    parser.add_argument("--dir", default=None, help="where to write the temporary log")
    args = parser.parse_args()
    if args.size_gb < 1.0:
        print("note: the issue's figure needs --size-gb >= 1", file=sys.stderr)
    workdir = Path(tempfile.mkdtemp(prefix="trainbench-parse-speed-", dir=args.dir))
    try:
        log = workdir / "log-pretrain_llama3.1_70b_fp8_64.out"
        t0 = time.perf_counter()
        size = generate(log, int(args.size_gb * 1e9))
        print(f"generated {size / 1e6:,.0f} MB in {time.perf_counter() - t0:.1f} s: {log}")

        grep_s, _, grep_out = timed(["grep", "-c", "train_step_timing", str(log)])
        trainbench = [sys.executable, "-m", "trainbench.cli", "results", str(log), "--format",
                      "json"]
        tb_s, tb_rss, tb_out = timed(trainbench)
        result = json.loads(tb_out)["experiments"][0]
        assert int(grep_out.strip()) == STEPS, grep_out
        assert result["steps_logged"] == STEPS and result["status"] == "Success", result

        mb = size / 1e6
        print(f"{'':24}{'seconds':>9}{'MB/s':>9}{'peak RSS':>11}")
        print(f"{'grep -c train_step_timing':24}{grep_s:9.2f}{mb / grep_s:9.0f}{'':>11}")
        print(f"{'trainbench results':24}{tb_s:9.2f}{mb / tb_s:9.0f}{tb_rss / 2**20:8.0f} MiB")
        print(f"trainbench/grep time ratio {tb_s / grep_s:.1f}x; parsed {result['steps_logged']} "
              f"steps, window mean {result['step_time_mean_s']:.2f} s, status {result['status']}")
    finally:
        shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
