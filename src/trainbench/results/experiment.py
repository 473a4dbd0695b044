"""One experiment's results as `trainbench results` reports them (one table row). Pure
Python, no torch."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from .parse import StepRecord
from .status import FAILED


@dataclass
class ExperimentResult:
    """Everything `trainbench results` reports about one run (one table row)."""

    name: str
    path: str
    log_file: str | None = None
    format: str | None = None
    status: str = FAILED
    status_detail: str = ""
    workload: str | None = None
    size: str | None = None
    dtype: str | None = None
    gpu_type: str | None = None
    gpus: int | None = None
    """GPUs, or ranks of a CPU run."""
    layout: str | None = None
    gbs: int | None = None
    seq_len: int | None = None
    identity_source: str = ""
    """Where workload/size/dtype/scale came from: 'plan.json', 'options', 'name' or ''."""
    steps_logged: int = 0
    last_iteration: int | None = None
    total_iterations: int | None = None
    window_start: int | None = None
    window_end: int | None = None
    window_count: int = 0
    step_time_mean_s: float | None = None
    step_time_std_s: float | None = None
    """Sample standard deviation (n-1) over the window."""
    tokens_per_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    tflops_per_gpu: float | None = None
    tflops_source: str | None = None
    """'computed (<convention>)' from the model's FLOPs, or 'log' (the log's own figure)."""
    log_tflops_per_gpu: float | None = None
    """Window mean of the TFLOPS the log itself printed, if any."""
    mfu_pct: float | None = None
    mfu_convention: str | None = None
    peak_tflops: float | None = None
    peak_source: str | None = None
    """'catalog', 'measured GEMM' (CPU runs) or 'user'."""
    mfu_problem: str | None = None
    """Set when the computed MFU is impossible (above 100%): the line saying the peak is
    wrong and how to fix it. mfu_pct is then None and the figure is in mfu_invalid_pct."""
    mfu_invalid_pct: float | None = None
    days_per_1t_tokens: float | None = None
    peak_memory_gib: float | None = None
    ref_step_time_s: float | None = None
    ref_tokens_per_s: float | None = None
    ref_mfu_pct: float | None = None
    """The reference MFU recomputed under this result's FLOPs convention."""
    pct_of_ref_step_time: float | None = None
    pct_of_ref_tokens_per_s: float | None = None
    predicted_step_time_s: float | None = None
    """predict's step time for the run's own plan (a trainbench run on a GPU;
    results/predicted.py)."""
    step_time_vs_predicted_pct: float | None = None
    """The measured step time's gap from predict's, in percent (+10 = 10% slower)."""
    predicted_mfu_pct: float | None = None
    """predict's MFU for the same plan (published FLOPs, the dtype's dense peak)."""
    predicted_memory_gib: float | None = None
    """predict's peak memory per GPU for the same plan (tensors and its allowance)."""
    memory_vs_predicted_pct: float | None = None
    """The measured peak's gap from predict's, in percent: the allocated peak where the run
    recorded it, else the reserved one (predicted_memory_basis says which)."""
    predicted_memory_basis: str | None = None
    energy_per_token_j: float | None = None
    """Energy over the timed window / its tokens, from run.json's telemetry (NVML on GPUs,
    RAPL on CPUs where readable); run.json's telemetry says what it covers."""
    throttled: bool | None = None
    """Whether clocks were throttled (power, thermal, HW slowdown) in the timed window;
    None where the machine cannot say."""
    gpu_shared: bool | None = None
    """Whether NVML counted another process on a GPU of this run during the timed window
    (run.json telemetry); None where it could not say."""
    profiling_overhead_pct: float | None = None
    """A profiled run's mean step time over its profiled steps in the window against its
    unprofiled ones there, in percent (+10 = profiled steps 10% slower)."""
    profiling_overhead: str | None = None
    """The same in words, or why it could not be measured (no unprofiled steps to compare)."""
    rank_compute_spread_pct: float | None = None
    """How far the slowest rank's median compute time (step time less its time in
    collectives, run.json `straggler`) lies above the median rank's, in percent."""
    straggler_rank: int | None = None
    """The slowest rank when it is more than 5% above the median rank; None otherwise."""
    straggler_host: str | None = None
    straggler: str | None = None
    """The straggler named in words, with the probe command that would confirm a
    hardware cause; None when no rank is more than 5% slower."""
    verdict: str = ""
    comparable: bool = True
    """False for profiled or NCCL-traced runs: their timings are not valid for comparison."""
    exit_code: int | None = None
    last_error: str | None = None
    failure_class: str | None = None
    """Why the run failed, when a line states a known cause (status.FAILURE_CLASSES)."""
    facts: dict = field(default_factory=dict)
    """What the log itself states (world_size, seq_len, gbs, tp, pp...); options override."""
    notes: list[str] = field(default_factory=list)
    records: list[StepRecord] = field(default_factory=list, repr=False)
    """Every step record (for plots); left out of to_dict()."""

    def to_dict(self, with_records: bool = False) -> dict:
        data = _json_safe(asdict(self))
        data.pop("records")
        if with_records:
            data["records"] = [_json_safe(r.to_dict()) for r in self.records]
        return data

    @property
    def window(self) -> tuple[int, int] | None:
        if self.window_start is None or self.window_end is None:
            return None
        return self.window_start, self.window_end


def _json_safe(data: dict) -> dict:
    """NaN and infinities as the strings 'nan'/'inf' (JSON has no such numbers), as the
    engine writes them in metrics.jsonl."""
    return {k: str(v) if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in data.items()}
