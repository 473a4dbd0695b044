"""GPU acceptance bench: MFU of trainbench's engine on one GPU against a Hugging Face loop.

A Llama 3.1 8B proxy at its real width (hidden 4096, 32 heads, 8 KV heads, FFN 14336,
vocabulary 128,256) with 4 layers, sequence 8192, MBS 1, on one GPU: trainbench's own
Trainer (engine model, chunked loss, fused AdamW, explicit SDPA order, FP8 through
torchao) in bf16 and fp8, and a plain Hugging Face `LlamaForCausalLM` training loop of the
same shape (bf16 autocast, fused AdamW, SDPA attention, HF's own loss) in the same
process. For each it prints tokens/s, TFLOPS and MFU in both FLOPs conventions
(trainbench.flops: 'published', the seeds' and NeMo's; 'causal', attention halved), peak
memory, the SDPA kernel, and the top operators of one profiled step by device time; then
the ratios the issue targets and `trainbench predict`'s figure for the same plan.

Issue 19's targets on an H100: bf16 MFU >= 55% (published convention), fp8 >= 1.3x bf16
tokens/s, trainbench bf16 >= 1.5x the HF loop.

Without a GPU it runs a tiny shape (hidden 64, 2 layers, seq 128) on the CPU in seconds
to check the bench itself, and prints no MFU.

    python bench/gpu_mfu.py [--steps 10] [--warmup 3] [--dtypes bf16,fp8] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from trainbench import flops
from trainbench.engine import data, sdpa
from trainbench.planning import build_plan

NO_GPU = "no GPU found: tiny CPU shape, no MFU"
PROXY = dict(layers=4, seq_len=8192, mbs=1, gbs=1, tp=1, pp=1, cp=1, dp=1)
TINY = dict(layers=2, seq_len=128, mbs=1, gbs=1)
TOP_OPS = 8


def make_plan(dtype: str, cuda: bool, peak: float | None, compile: bool | None = None,
              layers: int | None = None):
    """The bench's plan: the 8B proxy on this GPU, or the tiny Llama (hidden 64) on a CPU.

    On a CPU no MFU is printed, so a nominal peak skips the engine's GEMM peak
    measurement (seconds of work for a figure nobody reads)."""
    extra = {} if compile is None else dict(compile=compile)
    if layers is not None:
        extra["layers"] = layers
    if not cuda:
        return build_plan("pretrain_llama3.1", "tiny", dtype, 1, "cpu", steps=1000,
                          overrides=dict(TINY, **extra), peak_tflops=1.0)
    from trainbench.catalog import hardware
    gpu = hardware.gpu_from_device_name(torch.cuda.get_device_name())
    key = gpu.key if gpu is not None else "h100"  # an unknown GPU needs --peak-tflops
    if gpu is None and peak is None:
        sys.exit(f"gpu_mfu: {torch.cuda.get_device_name()} is not in the catalog; "
                 "give its dense peak with --peak-tflops")
    return build_plan("pretrain_llama3.1", "8b", dtype, 1, key, steps=1000,
                      overrides=dict(PROXY, **extra), peak_tflops=peak)


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def reset_peak_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_memory_gib() -> float:
    """Peak allocated since the last reset on a GPU; the process's peak RSS on a CPU
    (monotonic over the whole bench: a CPU figure is only a sanity check)."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2 ** 30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2 ** 30


# CUPTI's marker for a host that waited on a full launch queue (the GPU was busy, which
# is the healthy case): a span of time, not an operator.
NOT_OPERATORS = ("Command Buffer Full",)


def is_operator(event, cuda: bool) -> bool:
    """An operator row of the profile: on a GPU the operators (their kernels' time summed
    under them), not the kernels again, CUPTI's markers or record_function ranges
    ('Optimizer.step#AdamW.step'), which would count the same time twice."""
    if event.key in NOT_OPERATORS or "#" in event.key:
        return False
    device_type = getattr(event, "device_type", None)
    return not cuda or device_type is None or str(device_type).endswith("CPU")


def top_ops(step, cuda: bool) -> list[tuple[str, float, float]]:
    """(operator, ms, share of the profiled time) of one step, the TOP_OPS longest by self
    device time on a GPU (CPU time on a CPU)."""
    return profile_step(step, cuda)["top_ops"]


# Kernel names to what they do, first match wins: Triton's GEMM templates before Triton's
# fused pointwise and reduction kernels, cuBLAS/CUTLASS families by their name stems.
KERNEL_KINDS = (
    ("communication", ("nccl",)),
    ("attention", ("flash", "fmha", "attn", "cudnn")),
    ("gemm", ("triton_tem", "gemm", "cutlass", "nvjet", "xmma", "cublas", "sm90_", "sm100_",
              "grouped_mm", "_mm_")),
    ("optimizer", ("adam", "multi_tensor_apply")),
    ("triton fused", ("triton",)),
    ("copy or cast", ("copy", "cast", "fill")),
    ("index, sort, scatter", ("index", "scatter", "gather", "sort", "cumsum", "histc",
                              "bincount", "topk", "radix")),
    ("reduce", ("reduce",)),
    ("elementwise", ("elementwise",)),
)


def is_annotation(event) -> bool:
    """A labelled span on the GPU's timeline (record_function's 'Optimizer.step#AdamW.step',
    FSDP's 'FSDP::pre_forward', CUPTI's markers), not a kernel: it spans kernels that are
    counted on their own."""
    return (getattr(event, "is_user_annotation", False) or event.key in NOT_OPERATORS
            or "#" in event.key or event.key.startswith(("FSDP::", "ProfilerStep")))


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, stems in KERNEL_KINDS if any(s in low for s in stems)), "other")


def profile_step(step, cuda: bool) -> dict:
    """One profiled step: its top operators, and on a GPU its kernels: the longest, their
    time by kind, their sum against the step's wall time (the rest is the GPU waiting)."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        synchronize()
        start = time.perf_counter()
        step()
        synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3
    averages = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [e for e in averages if getattr(e, key) > 0 and is_operator(e, cuda)]
    total = sum(getattr(e, key) for e in events) or 1.0
    events.sort(key=lambda e: getattr(e, key), reverse=True)
    result = dict(top_ops=[(e.key, getattr(e, key) / 1e3, getattr(e, key) / total)
                           for e in events[:TOP_OPS]], wall_ms=wall_ms)
    if cuda:
        kernels = [e for e in averages if str(getattr(e, "device_type", "")).endswith("CUDA")
                   and e.self_device_time_total > 0 and not is_annotation(e)]
        kernels.sort(key=lambda e: e.self_device_time_total, reverse=True)
        by_kind: dict[str, float] = {}
        for e in kernels:
            kind = kernel_kind(e.key)
            by_kind[kind] = by_kind.get(kind, 0.0) + e.self_device_time_total / 1e3
        result.update(
            kernel_ms=sum(by_kind.values()), kernel_kinds=by_kind,
            top_kernels=[(e.key[:140], e.count, e.self_device_time_total / 1e3)
                         for e in kernels[:TOP_OPS]])
    return result


def print_kernels(label: str, profiled: dict) -> None:
    """The kernel lines of profile_step's result (nothing on a CPU)."""
    if "kernel_ms" not in profiled:
        return
    print(f"\n{label}: kernels of the profiled step: {profiled['kernel_ms']:.1f} ms of "
          f"{profiled['wall_ms']:.1f} ms wall ({100 * profiled['kernel_ms'] / profiled['wall_ms']:.0f}% busy)")
    for kind, ms in sorted(profiled["kernel_kinds"].items(), key=lambda kv: -kv[1]):
        print(f"  {ms:9.2f} ms  {kind}")
    print("  longest kernels (calls, ms):")
    for name, calls, ms in profiled["top_kernels"]:
        print(f"  {ms:9.2f} ms {calls:6d}x  {name}")


def force_one_rank_fsdp(mode: str) -> None:
    """Override the engine's one-rank choice for this process (a bench-only experiment):
    'on' wraps one rank in FSDP whatever the dtype, as every multi-rank layout is;
    'off' runs one rank under autocast, FP8 included (no FP8 all-gather without FSDP)."""
    if mode == "auto":
        return
    from trainbench.engine.parallel import float8
    from trainbench.plan import Plan
    Plan.one_rank_without_fsdp = property(lambda plan: mode == "off")
    if mode == "off":
        float8.float8_all_gather = lambda plan, backend: False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- trainbench ----------------------------------------------------------------------------

def bench_trainbench(plan, steps: int, warmup: int, cuda: bool) -> dict:
    """trainbench's own Trainer, one rank, in this process: Trainer.train_step times each
    step between two device synchronisations, as every trainbench run does."""
    from trainbench.engine.trainer import Trainer
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    reset_peak_memory()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(plan, Path(tmp) / "exp")
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # its log lines: a temp dir's
                trainer.setup()
            times = []
            for step in range(warmup + steps):
                metrics = trainer.train_step(step)
                if step >= warmup:
                    times.append(metrics.step_time_s)
            profiled = profile_step(lambda: trainer.train_step(warmup + steps), cuda)
            info = json.loads((trainer.exp_dir / "run.json").read_text())
            return dict(step_times=times, peak_memory_gib=peak_memory_gib(),
                        top_ops=profiled.pop("top_ops"), profiled=profiled,
                        sdpa_backend=info["sdpa_backend"], loss=metrics.loss,
                        optimizer=info["optimizer"]["implementation"],
                        fsdp_shards=info["parallel"]["fsdp_shards"],
                        peak_tflops=trainer.peak["peak_tflops"],
                        mfu_not_applicable=trainer.peak["mfu_not_applicable"])
        finally:
            trainer.close()


# --- Hugging Face --------------------------------------------------------------------------

def hf_model(spec, device: torch.device):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden, intermediate_size=spec.ffn,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim, rms_norm_eps=spec.norm_eps,
        rope_theta=spec.rope_base, max_position_embeddings=131072,
        tie_word_embeddings=False, attn_implementation="sdpa",
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    with torch.device(device):
        return LlamaForCausalLM(config).train()


def bench_hf(plan, steps: int, warmup: int, cuda: bool) -> dict:
    """The loop a Hugging Face user writes: fp32 weights, bf16 autocast, HF's loss from
    `labels`, clipping, fused AdamW on CUDA; the same kernels' order as trainbench."""
    device = torch.device("cuda" if cuda else "cpu")
    sdpa.use_engine_order(device.type)
    reset_peak_memory()
    model = hf_model(plan.model, device)
    opt = torch.optim.AdamW(model.parameters(), lr=plan.lr, betas=(0.9, 0.95),
                            weight_decay=0.1, **({"fused": True} if cuda else {"foreach": True}))

    def batch(step: int) -> torch.Tensor:
        inputs, _ = data.microbatch(plan.seed, step, 0, plan.mbs, plan.seq_len,
                                    plan.model.vocab_size)
        return inputs.to(device)

    def step_fn(tokens: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(input_ids=tokens, labels=tokens).loss  # HF shifts the labels
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    times = []
    for step in range(warmup + steps):
        tokens = batch(step)
        synchronize()
        start = time.perf_counter()
        loss = step_fn(tokens)
        synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    tokens = batch(warmup + steps)
    ops = top_ops(lambda: step_fn(tokens), cuda)
    heads = plan.model.heads, plan.model.kv_heads
    result = dict(step_times=times, peak_memory_gib=peak_memory_gib(), top_ops=ops,
                  sdpa_backend=sdpa.chosen_backend(device, torch.bfloat16, *heads,
                                                   plan.model.head_dim, plan.seq_len),
                  loss=float(loss), optimizer="fused" if cuda else "foreach")
    return result


# --- report --------------------------------------------------------------------------------

def figures(result: dict, plan, peak: float | None) -> dict:
    """tokens/s, TFLOPS and MFU (both conventions) from the median timed step."""
    step = statistics.median(result["step_times"])
    tokens = plan.seq_len * plan.gbs
    out = dict(step_time_s=step, tokens_per_s=tokens / step)
    for convention in flops.CONVENTIONS:
        tflops = flops.flops_per_sequence(plan.model, plan.seq_len, convention) \
            * plan.gbs / step / 1e12
        out[f"tflops_{convention}"] = tflops
        out[f"mfu_{convention}_pct"] = 100 * tflops / peak if peak else None
    return out


def predicted(plan) -> str:
    try:
        from trainbench.predict.perf import predict_step
        pred = predict_step(plan, sharding="engine")
    except Exception as err:  # noqa: BLE001 - a benchmark reports, it does not stop
        return f"no prediction for this plan ({type(err).__name__}: {err})"
    return (f"{pred.tokens_per_s:,.0f} tokens/s, {pred.step_time_s * 1e3:.1f} ms/step, "
            f"MFU {100 * pred.mfu:.1f}% published / {100 * pred.mfu_causal:.1f}% causal")


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}%"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps (default 10 on a GPU, 2 on a CPU)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed steps first (default 3 on a GPU, 1 on a CPU)")
    parser.add_argument("--dtypes", default="bf16,fp8",
                        help="trainbench dtypes, comma-separated (fp8 needs torchao)")
    parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face loop")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="dense peak of a GPU the catalog does not know")
    parser.add_argument("--compile", choices=["on", "off"], default=None,
                        help="trainbench's compiled blocks (default: the plan's, on on GPUs)")
    parser.add_argument("--one-rank-fsdp", choices=["auto", "on", "off"], default="auto",
                        help="auto: the engine's choice (one bf16 rank runs without FSDP, under "
                             "autocast; FP8 keeps FSDP); on/off: force it, for a like-for-like "
                             "bf16 vs fp8 comparison")
    parser.add_argument("--layers", type=int, default=None,
                        help="blocks in the proxy (default 4 on a GPU, 2 on a CPU)")
    parser.add_argument("--top", type=int, default=TOP_OPS, help="operators listed per run")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return parser.parse_args()


def print_shape(plans: dict, steps: int, warmup: int) -> None:
    """The proxy's shape (every dtype's plan has the same) and the steps timed."""
    spec = next(iter(plans.values())).model
    first = next(iter(plans.values()))
    print(f"shape: Llama 3.1 hidden {spec.hidden}, {spec.heads} heads / {spec.kv_heads} KV, "
          f"FFN {spec.ffn}, vocab {spec.vocab_size}, {spec.layers} layers, "
          f"seq {first.seq_len}, MBS {first.mbs}, GBS {first.gbs}; "
          f"{warmup} warm-up + {steps} timed steps (median)")


def bench_all(plans: dict, args: argparse.Namespace, steps: int, warmup: int,
              cuda: bool) -> list[dict]:
    """One row per trainbench dtype, then the Hugging Face loop's (bf16) unless --no-hf."""
    rows = []
    for dtype, plan in plans.items():
        result = bench_trainbench(plan, steps, warmup, cuda)
        reset_peak_memory()  # its model and optimizer went with the function's frame
        peak = result["peak_tflops"] if cuda and not result["mfu_not_applicable"] else None
        rows.append(dict(run="trainbench", dtype=dtype, **result, **figures(result, plan, peak),
                         mfu_peak=peak, predicted=predicted(plan)))
    if not args.no_hf:
        plan = plans.get("bf16") or make_plan("bf16", cuda, args.peak_tflops)
        result = bench_hf(plan, steps, warmup, cuda)
        reset_peak_memory()
        peak = plan.peak_tflops if cuda else None
        rows.append(dict(run="HF LlamaForCausalLM", dtype="bf16", **result,
                         **figures(result, plan, peak), mfu_peak=peak))
    return rows


def print_table(rows: list[dict]) -> None:
    # MFU is against the dtype's dense peak, as trainbench's results compute it: an fp8
    # run's against the fp8 peak (twice the bf16 one on Hopper).
    print("| run | dtype | ms/step | tokens/s | TFLOPS pub. | MFU pub. | TFLOPS causal "
          "| MFU causal | peak TFLOPS | peak mem GiB | SDPA | AdamW |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['dtype']} | {r['step_time_s'] * 1e3:.1f} | "
              f"{r['tokens_per_s']:,.0f} | {r['tflops_published']:.1f} | "
              f"{pct(r['mfu_published_pct'])} | {r['tflops_causal']:.1f} | "
              f"{pct(r['mfu_causal_pct'])} | {r['mfu_peak'] or '-'} | "
              f"{r['peak_memory_gib']:.2f} | "
              f"{r['sdpa_backend']} | {r['optimizer']} |")


def print_top_ops(rows: list[dict], cuda: bool) -> None:
    for r in rows:
        print(f"\n{r['run']} {r['dtype']}: top operators of one profiled step "
              f"(self {'device' if cuda else 'CPU'} time)")
        for name, ms, share in r["top_ops"]:
            print(f"  {ms:9.2f} ms {100 * share:5.1f}%  {name}")


def print_targets(rows: list[dict]) -> None:
    """The ratios issue 19 targets, where both of a ratio's runs ran, then predict's
    figure for each trainbench dtype."""
    by = {(r["run"], r["dtype"]): r for r in rows}
    tb_bf16, tb_fp8 = by.get(("trainbench", "bf16")), by.get(("trainbench", "fp8"))
    hf = by.get(("HF LlamaForCausalLM", "bf16"))
    print()
    if tb_bf16 and tb_fp8:
        print(f"fp8 / bf16 tokens/s: {tb_fp8['tokens_per_s'] / tb_bf16['tokens_per_s']:.2f}x "
              "(target >= 1.3x on an H100)")
    if tb_bf16 and hf:
        print(f"trainbench / HF tokens/s (bf16): "
              f"{tb_bf16['tokens_per_s'] / hf['tokens_per_s']:.2f}x (target >= 1.5x)")
    for r in rows:
        if "predicted" in r:
            print(f"predict, trainbench {r['dtype']}: {r['predicted']}")


def main() -> None:
    global TOP_OPS
    args = parse_args()
    cuda = torch.cuda.is_available()
    steps = args.steps or (10 if cuda else 2)
    warmup = args.warmup if args.warmup is not None else (3 if cuda else 1)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]

    device = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"gpu_mfu: {device}, torch {torch.__version__}")
    if not cuda:
        print(NO_GPU)
    TOP_OPS = args.top
    force_one_rank_fsdp(args.one_rank_fsdp)
    compile_ = None if args.compile is None else args.compile == "on"
    plans = {dtype: make_plan(dtype, cuda, args.peak_tflops, compile_, args.layers) for dtype in dtypes}
    print_shape(plans, steps, warmup)
    rows = bench_all(plans, args, steps, warmup, cuda)
    print_table(rows)
    print_top_ops(rows, cuda)
    print_targets(rows)
    if not cuda:
        print(NO_GPU)
    if args.json:
        args.json.write_text(json.dumps(dict(device=device, torch=torch.__version__,
                                             gpu=cuda, rows=rows), indent=2))


if __name__ == "__main__":
    main()
