"""The project's own GPU measurements as predict checks, and accuracy by group. Pure data
and arithmetic, no torch.

One H100 80GB HBM3 SXM, 2026-11-26 (docs/gpu-runs/2026-11-26-h100/): Llama 3.1 8B proxies
at their real width (hidden 4096, 32/8 heads, FFN 14336, vocab 128,256, seq 8192, MBS 1),
torch 2.11, torchao 0.18, compiled blocks, as the engine runs them by default (bf16
without FSDP on one rank, FP8 with FSDP and its float8 all-gather;
Plan.one_rank_without_fsdp). The same day's runs with one-rank FSDP switched against the
default (bf16 with it, FP8 without) are not here: a plan cannot ask for them, so predict
cannot be checked on them (docs/predict-accuracy.md gives their figures).

One H200 (141 GB), 2026-11-27 (docs/gpu-runs/2026-11-27-h200/), the same software: the
MoE proxies of bench/gpu_moe.py (Qwen3 and DeepSeek-V3 at real width, cut in depth or
routed experts) and three rows of `trainbench accept` (DeepSeek-V3 bf16, Llama 3.1 and
Nemotron-H FP8). Their peaks are the two tools' own: gpu_moe.py reads the allocator's
peak of allocated bytes, `trainbench run` the peak it reserved (what an out-of-memory
error is decided against), which predict's fragmentation allowance stands for.

One H200, 2026-11-28 (docs/gpu-runs/2026-11-28-h200/), the same software and today's
engine (an MoE layer keeps no expert output): the MoE proxies again, where they ran, in
place of the day before's, and three dense rows of `trainbench accept` no GPU had run.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

H100_LOGS = "docs/gpu-runs/2026-11-26-h100"
H200_LOGS = "docs/gpu-runs/2026-11-27-h200"
H200_LOGS_28 = "docs/gpu-runs/2026-11-28-h200"
PROBE_PROFILES = {
    "h100": f"{H100_LOGS}/hardware-profile-h100.json",
}
"""`trainbench probe`'s profile of each GPU type the project ran on, as predict --hardware
reads it, where the probe had its GPU to itself. The H200's of 2026-11-28
(accept_checks/runs/probe/) did not: it started at 06:33:16 and wrote its profile at
06:33:55, and the lease's next step started the Llama 2 accept row on the same GPU at
06:33:24 (its experiment's name), so every figure it timed shared the GPU. Its attention
read 188 TFLOPS, against 444 from the same code on the H100 and 360-450 from the MoE
proxies' own cuDNN kernels on the H200."""
ONE_RANK = {"tp": 1, "cp": 1, "pp": 1, "dp": 1}
# bench/gpu_moe.py's one-GPU MoE shape (ONE_GPU there).
MOE_PROXY = dict(ONE_RANK, ep=1, vp=1, seq_len=4096, mbs=1, gbs=2)


@dataclass(frozen=True)
class ProjectRun:
    label: str
    dtype: str
    step_time_s: float
    """The run's own step figure: the median (gpu_mfu.py, gpu_moe.py) or mean (results'
    window, `trainbench run`) of its timed steps."""
    log: str
    command: str
    workload: str = "pretrain_llama3.1"
    size: str = "8b"
    gpu: str = "h100"
    overrides: dict = field(default_factory=dict)
    """The plan as it ran (`--set`)."""
    log_dir: str = H100_LOGS
    peak_gib: float | None = None
    peak_kind: str | None = None
    """'allocated' or 'reserved': which of the allocator's peaks `peak_gib` is."""
    metrics: str | None = None
    """The run's metrics.jsonl (under log_dir), where its allocated peak
    (`peak_allocated_bytes`) is read from."""

    @property
    def name(self) -> str:
        return f"{self.label} {self.dtype} on {self.gpu.upper()} ({self.log})"


def _llama_proxy(dtype: str, layers: int, gbs: int, step_s: float, log: str,
                 command: str) -> ProjectRun:
    """An H100 8B proxy: FSDP fully sharded with fp32 gradient reduction, the engine's
    defaults that day."""
    return ProjectRun(f"8B proxy {layers} layers GBS {gbs}", dtype, step_s, log, command,
                      overrides=dict(ONE_RANK, layers=layers, mbs=1, gbs=gbs,
                                     dp_sharding="full", reduce_dtype="fp32"))


def _moe_proxy(label: str, size: str, dtype: str, step_s: float, peak_gib: float, log: str,
               command: str, workload: str = "pretrain_qwen3", log_dir: str = H200_LOGS_28,
               **shape) -> ProjectRun:
    return ProjectRun(label, dtype, step_s, log, command, workload=workload, size=size,
                      gpu="h200", overrides=dict(MOE_PROXY, **shape), log_dir=log_dir,
                      peak_gib=peak_gib, peak_kind="allocated")


def _accept_row(label: str, workload: str, size: str, dtype: str, step_s: float,
                peak_gib: float, log: str, steps: int = 8, log_dir: str = H200_LOGS,
                metrics: str | None = None, **shape) -> ProjectRun:
    """A row of `trainbench accept`: its reserved peak, or, where `metrics` names the run's
    metrics.jsonl (which records it from 2026-11-28 on), its allocated peak."""
    sets = " ".join(f"{k}={v}" for k, v in shape.items() if k != "ssd_scan")
    return ProjectRun(label, dtype, step_s, log,
                      f'trainbench run -w {workload} -s {size} --dtype {dtype} --scale 1 '
                      f'--gpu h200 --steps {steps} --set "{sets} tp=1 pp=1 cp=1 dp=1" (from '
                      f'`trainbench accept`)', workload=workload, size=size, gpu="h200",
                      overrides=dict(ONE_RANK, **shape), log_dir=log_dir, peak_gib=peak_gib,
                      peak_kind="allocated" if metrics else "reserved", metrics=metrics)


def _accept_metrics(label: str, run_dir: str) -> str:
    """accept_dense/'s metrics.jsonl of one row."""
    workload_dir = run_dir.rsplit("_", 1)[0]
    return f"accept_dense/runs/{label}/experiments/{workload_dir}/{run_dir}/metrics.jsonl"


_GPU_MFU_8 = "python bench/gpu_mfu.py --layers 8 --dtypes bf16,fp8 --no-hf"
_GPU_MOE = "python bench/gpu_moe.py --proxies {} --dtypes {} --steps 5 --warmup 3 --no-layer"

PROJECT_RUNS = (
    _llama_proxy("bf16", 4, 1, 0.1839, "gpu_mfu.log", "python bench/gpu_mfu.py"),
    _llama_proxy("fp8", 4, 1, 0.1857, "gpu_mfu.log", "python bench/gpu_mfu.py"),
    _llama_proxy("fp8", 4, 1, 0.1847, "gpu_mfu_one_rank_fsdp_on.log",
                 "python bench/gpu_mfu.py --dtypes bf16,fp8 --no-hf --one-rank-fsdp on "
                 "--steps 8"),
    _llama_proxy("bf16", 8, 1, 0.2824, "gpu_mfu_8layers_fsdp_off.log",
                 f"{_GPU_MFU_8} --one-rank-fsdp off --steps 5 --warmup 2"),
    _llama_proxy("fp8", 8, 1, 0.2791, "gpu_mfu_8layers_fsdp_on.log",
                 f"{_GPU_MFU_8} --one-rank-fsdp on --steps 5 --warmup 2"),
    _llama_proxy("bf16", 8, 4, 1.043, "run_8layers_gbs4.log",
                 'trainbench run -w pretrain_llama3.1 -s 8b --scale 1 --steps 8 '
                 '--set "layers=8 tp=1 cp=1 pp=1 dp=1 mbs=1 gbs=4"'),
    _llama_proxy("bf16", 4, 8, 1.332, "gpu_smoke.log", "python bench/gpu_smoke.py --steps 10"),
    _llama_proxy("fp8", 4, 8, 1.332, "gpu_smoke.log", "python bench/gpu_smoke.py --steps 10"),
    _moe_proxy("Qwen3 235B-A22B proxy 2 layers", "235b_a22b", "bf16", 0.2832, 108.69,
               "moe_235b_bf16.log", _GPU_MOE.format("qwen3-235b", "bf16") + " --top 40",
               layers=2),
    # Not run again on 2026-11-28: the day before's engine, which kept expert outputs.
    _moe_proxy("Qwen3 235B-A22B proxy 2 layers", "235b_a22b", "fp8", 0.3054, 103.98,
               "moe_235b_fp8.log", _GPU_MOE.format("qwen3-235b", "fp8"), log_dir=H200_LOGS,
               layers=2),
    _moe_proxy("Qwen3 30B-A3B proxy 2 layers", "30b_a3b", "bf16", 0.1164, 35.37,
               "moe_30b_bf16.log", _GPU_MOE.format("qwen3-30b", "bf16") + " --top 40",
               layers=2),
    _moe_proxy("Qwen3 30B-A3B proxy 2 layers", "30b_a3b", "fp8", 0.1340, 32.31,
               "moe_30b_fp8.log", "python bench/gpu_moe.py --proxies qwen3-30b --dtypes fp8 "
               "--steps 3 --warmup 2 --no-layer --top 40", layers=2),
    _moe_proxy("DeepSeek-V3 proxy 4 layers, 32 experts, full recompute", "671b", "fp8",
               0.7818, 69.04, "moe_dsv3_fp8.log",
               "python bench/gpu_moe.py --proxies deepseek-v3 --dtypes fp8 --steps 3 "
               "--warmup 2 --no-layer --top 40", workload="pretrain_deepseek_v3", layers=4,
               experts=32, recompute="full"),
    _accept_row("DeepSeek-V3 proxy 4 layers, 8 experts", "pretrain_deepseek_v3", "671b",
                "bf16", 0.4922, 66.2, "accept_dsv3/logs/deepseek_v3-bf16.log", layers=4,
                experts=8, mbs=1, gbs=2, ep=1, vp=1),
    _accept_row("Llama 3.1 8B proxy 4 layers GBS 2", "pretrain_llama3.1", "8b", "fp8",
                0.2826, 51.3, "accept_fp8/logs/llama3.1-fp8.log", layers=4, mbs=1, gbs=2),
    # mamba_ssm is not on the GPU image: the engine ran the compiled torch scan.
    _accept_row("Nemotron-H 56B proxy 3 layers (M-*)", "pretrain_nemotronh", "56b", "fp8",
                0.563, 84.5, "accept_fp8/logs/nemotronh-fp8.log", layers=3, mbs=1, gbs=2,
                ssd_scan="torch"),
    _accept_row("Nemotron-4 15B proxy 2 layers", "pretrain_nemotron4", "15b", "bf16", 0.2884,
                72.39, "accept_dense/logs/nemotron4-bf16.log", steps=6, log_dir=H200_LOGS_28,
                metrics=_accept_metrics("nemotron4-bf16",
                                        "pretrain_nemotron4_15b_bf16_gpus1_20261128-063409"),
                layers=2, mbs=1, gbs=2),
    _accept_row("Nemotron-H 56B proxy 3 layers (M-*)", "pretrain_nemotronh", "56b", "bf16",
                0.491, 62.42, "accept_dense/logs/nemotronh-bf16.log", steps=6,
                log_dir=H200_LOGS_28,
                metrics=_accept_metrics("nemotronh-bf16",
                                        "pretrain_nemotronh_56b_bf16_gpus1_20261128-063447"),
                layers=3, mbs=1, gbs=2, ssd_scan="torch"),
    # Its iterations 1-3 (0.56 s) shared the GPU with the probe that the lease's previous
    # step had left running past its time limit; the window's mean (0.455 s) is theirs.
    # Iteration 5, the GPU its own, is the figure: 0.2455 s.
    _accept_row("Llama 2 70B proxy 2 layers (last iteration)", "pretrain_llama2", "70b",
                "bf16", 0.2455, 37.75, "accept_dense/logs/llama2-bf16.log", steps=6,
                log_dir=H200_LOGS_28,
                metrics=_accept_metrics("llama2-bf16",
                                        "pretrain_llama2_70b_bf16_gpus1_20261128-063324"),
                layers=2, mbs=1, gbs=2),
)


@dataclass(frozen=True)
class GroupError:
    """Signed relative errors of one group of measurements, as fractions."""
    group: str
    errors: tuple[float, ...]

    @property
    def mean_abs_pct(self) -> float:
        return 100 * statistics.fmean(abs(e) for e in self.errors)

    @property
    def max_abs_pct(self) -> float:
        return 100 * max(abs(e) for e in self.errors)


def group_errors(pairs: list[tuple[str, float]]) -> dict[str, GroupError]:
    """(group, signed error) pairs gathered into groups, in first-seen order."""
    out: dict[str, list[float]] = {}
    for group, err in pairs:
        out.setdefault(group, []).append(err)
    return {g: GroupError(g, tuple(errs)) for g, errs in out.items()}
