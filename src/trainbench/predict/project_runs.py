"""The project's own GPU measurements as predict checks, and accuracy by group. Pure data
and arithmetic, no torch.

Every run below is a Llama 3.1 8B proxy at its real width (hidden 4096, 32/8 heads, FFN
14336, vocab 128,256, seq 8192, MBS 1) on one H100 80GB HBM3 SXM, torch 2.11, torchao
0.18, compiled blocks, as the engine runs it by default (bf16 without FSDP on one rank,
FP8 with FSDP and its float8 all-gather; engine/parallel/__init__.py,
single_rank_without_fsdp). The logs are in docs/gpu-runs/2026-11-26-h100/, named in
`log`. The same day's runs with one-rank FSDP switched against the default (bf16 with it,
FP8 without) are not here: a plan cannot ask for them, so predict cannot be checked on
them (docs/predict-accuracy.md gives their figures).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

LOG_DIR = "docs/gpu-runs/2026-11-26-h100"


@dataclass(frozen=True)
class ProjectRun:
    dtype: str
    layers: int
    gbs: int
    step_time_s: float
    """The median step of the run's timed window."""
    log: str
    command: str

    @property
    def name(self) -> str:
        return f"8B proxy {self.layers} layers {self.dtype} GBS {self.gbs} ({self.log})"

    @property
    def overrides(self) -> dict:
        """The plan as it ran: FSDP fully sharded with fp32 gradient reduction, the
        engine's defaults that day."""
        return {"layers": self.layers, "tp": 1, "cp": 1, "pp": 1, "dp": 1, "mbs": 1,
                "gbs": self.gbs, "dp_sharding": "full", "reduce_dtype": "fp32"}


PROJECT_RUNS = (
    ProjectRun("bf16", 4, 1, 0.1839, "gpu_mfu.log", "python bench/gpu_mfu.py"),
    ProjectRun("fp8", 4, 1, 0.1857, "gpu_mfu.log", "python bench/gpu_mfu.py"),
    ProjectRun("fp8", 4, 1, 0.1847, "gpu_mfu_one_rank_fsdp_on.log",
               "python bench/gpu_mfu.py --dtypes bf16,fp8 --no-hf --one-rank-fsdp on --steps 8"),
    ProjectRun("bf16", 8, 1, 0.2824, "gpu_mfu_8layers_fsdp_off.log",
               "python bench/gpu_mfu.py --layers 8 --dtypes bf16,fp8 --no-hf "
               "--one-rank-fsdp off --steps 5 --warmup 2"),
    ProjectRun("fp8", 8, 1, 0.2791, "gpu_mfu_8layers_fsdp_on.log",
               "python bench/gpu_mfu.py --layers 8 --dtypes bf16,fp8 --no-hf "
               "--one-rank-fsdp on --steps 5 --warmup 2"),
    ProjectRun("bf16", 8, 4, 1.043, "run_8layers_gbs4.log",
               'trainbench run -w pretrain_llama3.1 -s 8b --scale 1 --steps 8 '
               '--set "layers=8 tp=1 cp=1 pp=1 dp=1 mbs=1 gbs=4"'),
    ProjectRun("bf16", 4, 8, 1.332, "gpu_smoke.log", "python bench/gpu_smoke.py --steps 10"),
    ProjectRun("fp8", 4, 8, 1.332, "gpu_smoke.log", "python bench/gpu_smoke.py --steps 10"),
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
