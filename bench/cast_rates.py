"""How fast one GPU casts and accumulates whole tensors: the rates behind predict's
streaming passes (Constants.stream_eff) and torch's eager bf16-to-fp32 copy
(Constants.eager_upcast_eff).

Each pass runs over a 128 x 1536 x 4096 tensor (805M elements: one Qwen3 235B-A22B
layer's expert gate weights), timed between CUDA events over 10 repetitions after one
untimed. Bytes are those read and written: a bf16-to-fp32 cast moves 6 B an element.

    python bench/cast_rates.py        (needs a CUDA GPU; prints one line per pass)
"""

from __future__ import annotations

import sys

import torch

SHAPE = (128, 1536, 4096)


def timed(name: str, fn, nbytes: float, reps: int = 10) -> None:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / reps
    print(f"{name:50s} {ms:8.3f} ms  {nbytes / ms / 1e9:6.2f} TB/s", flush=True)


def main() -> int:
    if not torch.cuda.is_available():
        print("cast_rates: no GPU found; the rates are a GPU's")
        return 0
    torch.manual_seed(0)
    g = torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(SHAPE, device="cuda", dtype=torch.float32)
    acc = torch.zeros(SHAPE, device="cuda", dtype=torch.float32)
    out = torch.empty(SHAPE, device="cuda", dtype=torch.float32)
    upcast = torch.compile(lambda x: x.float())
    accumulate = torch.compile(lambda a, x: a + x.float())
    n = g.numel()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    timed("fp32->bf16 w.to(bf16)", lambda: w.to(torch.bfloat16), 6 * n)
    timed("bf16->fp32 g.float()", lambda: g.float(), 6 * n)
    timed("bf16->fp32 out.copy_(g)", lambda: out.copy_(g), 6 * n)
    timed("bf16->fp32 compiled", lambda: upcast(g), 6 * n)
    timed("fp32 acc.add_(fp32)", lambda: acc.add_(w), 12 * n)
    timed("fp32 acc.add_(bf16)", lambda: acc.add_(g), 10 * n)
    timed("compiled acc + g.float()", lambda: accumulate(acc, g), 10 * n)
    timed("fp32 copy", lambda: out.copy_(w), 8 * n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
