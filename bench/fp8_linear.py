"""FP8 against BF16 for one Llama 3.1 8B block's linears: torchao Float8Linear vs nn.Linear.

Isolates what FP8 training can buy from the GEMMs alone, before the rest of a step (LM
head, attention, optimizer, FSDP) dilutes it: the seven linears of one block (q, k, v, o,
w1, w3, w2 at hidden 4096, FFN 14336, 8 KV heads), each run forward and backward on its
own input of `--tokens` rows, with bf16 weights (what FSDP's mixed precision hands a
block). Variants: bf16, fp8 tensorwise and fp8 rowwise (torchao's recipes), each eager
and under torch.compile. Timed with CUDA events over `--iters` iterations after a
warm-up; prints ms per pass, TFLOPS (6 x tokens x parameters per pass) and the speed-up
over bf16 of the same mode.

Without a GPU it runs a tiny shape eagerly on the CPU to check itself and prints no
speed-up (FP8 is emulated there).

    python bench/fp8_linear.py [--tokens 8192] [--iters 20]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from torch import nn

# (name, in, out) for Llama 3.1 8B's block (../shared/reference/architectures.md).
BLOCK_8B = [("wq", 4096, 4096), ("wk", 4096, 1024), ("wv", 4096, 1024), ("wo", 4096, 4096),
            ("w1", 4096, 14336), ("w3", 4096, 14336), ("w2", 14336, 4096)]
BLOCK_TINY = [(name, i // 64, o // 64) for name, i, o in BLOCK_8B]


class Linears(nn.Module):
    """The block's linears side by side: each gets its own input, so the pass is the
    GEMMs (and FP8's casts) alone."""

    def __init__(self, shapes):
        super().__init__()
        self.names = [name for name, _, _ in shapes]
        for name, i, o in shapes:
            setattr(self, name, nn.Linear(i, o, bias=False))

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        total = 0
        for name, x in zip(self.names, inputs):
            total = total + getattr(self, name)(x).float().square().mean()
        return total


def to_fp8(model: nn.Module, recipe: str) -> nn.Module:
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    config = Float8LinearConfig.from_recipe_name(recipe)
    return convert_to_float8_training(model, config=config)


def time_pass(model: nn.Module, inputs, iters: int, warmup: int, cuda: bool) -> float:
    """Median ms of one forward + backward."""
    def once():
        model(inputs).backward()
    for _ in range(warmup):
        once()
    times = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            once()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            once()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=None, help="rows (default 8192 on a GPU)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    shapes = BLOCK_8B if cuda else BLOCK_TINY
    tokens = args.tokens or (8192 if cuda else 128)
    print(f"fp8_linear: {torch.cuda.get_device_name() if cuda else 'CPU (FP8 emulated)'}, "
          f"torch {torch.__version__}, {tokens} tokens, linears {[s[1:] for s in shapes]}")
    torch.manual_seed(0)
    with torch.device(device):
        base = Linears(shapes).to(torch.bfloat16)
    inputs = [torch.randn(tokens, i, device=device, dtype=torch.bfloat16, requires_grad=True)
              for _, i, _ in shapes]
    params = sum(p.numel() for p in base.parameters())
    flop = 6 * tokens * params
    modes = ["eager", "compiled"] if cuda else ["eager"]
    variants = ["bf16", "fp8 tensorwise", "fp8 rowwise"]
    results: dict[tuple[str, str], float] = {}
    for mode in modes:
        for variant in variants:
            model = copy.deepcopy(base)
            if variant != "bf16":
                model = to_fp8(model, variant.split()[1])
            if mode == "compiled":
                torch._dynamo.reset()
                model = torch.compile(model)
            try:
                ms = time_pass(model, inputs, args.iters, args.warmup, cuda)
            except Exception as err:  # noqa: BLE001 - a benchmark reports, it does not stop
                print(f"{variant:<15} {mode:<9} failed: {type(err).__name__}: {err}")
                continue
            results[(mode, variant)] = ms
            speedup = results[(mode, variant)] / results[(mode, "bf16")] \
                if (mode, "bf16") in results else None
            print(f"{variant:<15} {mode:<9} {ms:8.2f} ms  {flop / ms / 1e9:8.1f} TFLOPS"
                  + (f"  {1 / speedup:.2f}x bf16" if cuda and speedup else ""), flush=True)
    if not cuda:
        print("no GPU found: tiny CPU shape, FP8 emulated, no speed-up")


if __name__ == "__main__":
    main()
