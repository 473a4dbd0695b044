"""Status, window statistics, metrics, identity inference and the reference comparison
of results/summary.py, each checked against a hand computation written here."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainbench.catalog.models import get_model
from trainbench.engine.log import StepMetrics, format_step_line
from trainbench.flops import flops_per_sequence
from trainbench.plan import Features
from trainbench.planning import build_plan
from trainbench.results.infer import Identity, infer_identity
from trainbench.results.parse import StepRecord
from trainbench.results.status import (
    FAILED, INCOMPLETE, INVALID, SUCCESS, UNRECOGNISED, compute_status, logging_stride,
)
from trainbench.results.summary import speed_verdict, summarize_experiment

LOGS = Path(__file__).parent / "data" / "logs"


def nemo2_log(path: Path, times: list[float], gbs: int = 128, losses=None, last: int | None = None) -> Path:
    """A NeMo 2 log of len(times) steps of a run of `last + 1` steps."""
    last = len(times) - 1 if last is None else last
    losses = losses or [10.0] * len(times)
    lines = ["[NeMo I 2025-04-11 14:30:40 nemo_logging:393] starting"]
    for i, t in enumerate(times):
        lines.append(f"Training epoch 0, iteration {i}/{last} | global_batch_size: {gbs} | "
                     f"reduced_train_loss: {losses[i]} | train_step_timing in s: {t} | "
                     f"consumed_samples: {gbs * (i + 1)}")
        lines.append("node1:1:1 [0] NCCL INFO AllReduce: opCount 3 count 1 datatype 1")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def recs(iterations, total=None, loss=1.0, grad=None):
    return [StepRecord(i, total, step_time_s=1.0, loss=loss, grad_norm=grad) for i in iterations]


# --- status -----------------------------------------------------------------------------------

def test_status_success():
    s = compute_status(recs(range(50), 50), 50, (11, 44))
    assert (s.status, s.detail) == (SUCCESS, "")


def test_status_incomplete_says_where_it_stopped():
    s = compute_status(recs(range(38), 50), 50, (11, 44), last_error="RuntimeError: boom")
    assert s.status == INCOMPLETE
    assert s.detail == "stopped at iteration 37 of 0..49: RuntimeError: boom"


def test_status_incomplete_when_the_window_has_a_gap():
    its = [i for i in range(50) if i != 20]
    s = compute_status(recs(its, 50), 50, (11, 44))
    assert s.status == INCOMPLETE and "misses 1 iteration(s): 20" in s.detail


def test_status_incomplete_when_the_window_is_past_the_run():
    s = compute_status(recs(range(20), 20), 20, (11, 44))
    assert s.status == INCOMPLETE and "extends past the last iteration 19" in s.detail


def test_status_failed_carries_the_error_line():
    s = compute_status([], 50, (11, 44), last_error="torch.OutOfMemoryError: CUDA out of memory")
    assert s.status == FAILED and s.detail.endswith("torch.OutOfMemoryError: CUDA out of memory")
    assert compute_status([], None, (0, 0)).detail == (
        "no training step was logged and no error line in the log")


@pytest.mark.parametrize("loss,grad,what", [(float("nan"), 1.0, "loss is nan"),
                                             (2.0, float("inf"), "gradient norm is inf")])
def test_status_invalid_on_nonfinite_values(loss, grad, what):
    records = recs(range(50), 50)
    records[30] = StepRecord(30, 50, step_time_s=1.0, loss=loss, grad_norm=grad)
    s = compute_status(records, 50, (11, 44))
    assert s.status == INVALID and s.detail == f"{what} at iteration 30"


def test_status_with_unknown_run_length_says_so():
    s = compute_status(recs(range(50)), None, (11, 44))
    assert s.status == SUCCESS and "run length not printed" in s.detail


def test_status_of_a_log_printing_every_tenth_step():
    its = list(range(9, 100, 10))  # Megatron log-interval 10: iterations 10..100, 1-based
    assert logging_stride(its) == 10
    assert compute_status(recs(its, 100), 100, (22, 88)).status == SUCCESS


# --- window statistics and metrics vs a hand computation -----------------------------------

def test_window_statistics_reproduce_a_hand_computation(tmp_path):
    times = [30.0, 14.0, 13.0] + [12.0 + 0.1 * ((i * 7) % 5) for i in range(3, 50)]
    path = nemo2_log(tmp_path / "experiments" / "pretrain_llama3.1_8b_bf16_8" / "log-x.out", times)
    r = summarize_experiment(path)
    window = times[11:45]  # iterations 11..44 inclusive, the seeds' window of 50 steps
    mean = sum(window) / len(window)
    std = math.sqrt(sum((x - mean) ** 2 for x in window) / (len(window) - 1))
    assert (r.window_start, r.window_end, r.window_count) == (11, 44, 34)
    assert r.step_time_mean_s == pytest.approx(mean, rel=1e-12)
    assert r.step_time_std_s == pytest.approx(std, rel=1e-12)
    # Seed 002's formulas: tokens/s = seq * GBS / t; the Llama 3.1 8B FLOPs of its Notes.
    assert r.tokens_per_s == pytest.approx(8192 * 128 / mean, rel=1e-12)
    assert r.tokens_per_s_per_gpu == pytest.approx(8192 * 128 / mean / 8, rel=1e-12)
    flops = 8192 * (20_937_965_568 + 33_822_867_456 + 3_152_019_456)
    assert r.tflops_per_gpu == pytest.approx(128 * flops / mean / 8 / 1e12, rel=1e-9)
    assert r.mfu_pct == pytest.approx(100 * 128 * flops / mean / 8 / 989e12, rel=1e-9)
    assert r.days_per_1t_tokens == pytest.approx(1e12 / (8192 * 128 / mean) / 86400, rel=1e-12)
    assert (r.status, r.mfu_convention, r.peak_source) == (SUCCESS, "published", "catalog")


def test_user_window_and_causal_convention(tmp_path):
    times = [5.0] * 3 + [2.0, 2.5, 3.0, 2.5] + [2.0] * 13
    # GBS 16: at 2.5 s/step GBS 128 would be 307% MFU on 8 H100 (an impossible figure).
    path = nemo2_log(tmp_path / "pretrain_llama3.1_8b_bf16_8" / "log-x.out", times, gbs=16)
    r = summarize_experiment(path, window=(3, 6), convention="causal")
    assert r.step_time_mean_s == pytest.approx(2.5)
    assert r.step_time_std_s == pytest.approx(math.sqrt((0.25 + 0 + 0.25 + 0) / 3))
    assert r.mfu_convention == "causal" and r.tflops_source == "computed (causal)"
    published = summarize_experiment(path, window=(3, 6))
    assert r.mfu_pct < published.mfu_pct  # causal attention counts fewer FLOPs


def test_reference_comparison_and_verdict(tmp_path):
    # Llama 3.1 8B BF16 on 8 GPUs: reference 12.27 s/step, 85459 tokens/s (seed 002).
    path = nemo2_log(tmp_path / "pretrain_llama3.1_8b_bf16_8" / "log-x.out", [13.5] * 50)
    r = summarize_experiment(path)
    assert r.ref_step_time_s == 12.27 and r.ref_tokens_per_s == 85459
    assert r.pct_of_ref_step_time == pytest.approx(100 * 13.5 / 12.27)
    assert r.pct_of_ref_tokens_per_s == pytest.approx(100 * (8192 * 128 / 13.5) / 85459)
    assert r.verdict == f"{(85459 / (8192 * 128 / 13.5) - 1) * 100:.0f}% slower"


def test_speed_verdict_words():
    assert speed_verdict(1.049) == "within 5%"
    assert speed_verdict(0.951) == "within 5%"
    assert speed_verdict(1.10) == "10% slower"
    assert speed_verdict(0.80) == "20% faster"
    assert speed_verdict(1.02, tolerance_pct=1) == "2% slower"


def test_no_reference_for_an_unknown_workload(tmp_path):
    r = summarize_experiment(nemo2_log(tmp_path / "run.log", [1.0] * 50))
    assert r.workload is None and r.verdict == "no reference"
    assert r.tokens_per_s is None and r.mfu_pct is None
    assert r.step_time_mean_s == pytest.approx(1.0)


def test_options_describe_a_foreign_log(tmp_path):
    r = summarize_experiment(LOGS / "megatron" / "megatron-bridge-llama3-8b.log",
                             workload="pretrain_llama3.1", size="8b", dtype="fp8", scale=8)
    assert (r.workload, r.size, r.dtype, r.gpus, r.gbs) == ("pretrain_llama3.1", "8b", "fp8", 8, 128)
    assert r.identity_source == "options" and r.status == SUCCESS
    assert r.ref_step_time_s == 9.33 and r.verdict == "within 5%"
    assert r.log_tflops_per_gpu is not None and r.tflops_source == "computed (published)"


def test_bad_options_are_value_errors(tmp_path):
    log = nemo2_log(tmp_path / "run.log", [1.0] * 5)
    for kwargs in ({"workload": "pretrain_gpt5"}, {"workload": "pretrain_llama2", "size": "8b"},
                   {"dtype": "fp4"}, {"gpu": "tpu"}, {"convention": "other"}):
        with pytest.raises(ValueError):
            summarize_experiment(log, **kwargs)


def test_failed_and_incomplete_fixtures():
    failed = summarize_experiment(next(LOGS.glob("nemo2/experiments/pretrain_llama3.1_70b*/*/*/log-*")))
    assert failed.status == FAILED and failed.verdict == "failed"
    assert failed.failure_class == "CUDA out of memory"
    assert failed.last_error.startswith("torch.OutOfMemoryError: CUDA out of memory.")
    # A run that stopped early with a NCCL watchdog timeout at its end failed: the
    # timeout, not the `NCCL communicator was aborted` it led to, is named.
    stopped = summarize_experiment(next(LOGS.glob("nemo2/experiments/pretrain_nemotronh*/*/log-*")))
    assert stopped.status == FAILED
    assert stopped.status_detail.startswith("stopped at iteration 37 of 0..49")
    assert "Watchdog caught collective operation timeout" in stopped.last_error
    assert stopped.failure_class == "NCCL timeout"
    assert stopped.verdict == "failed"


# --- trainbench run directories --------------------------------------------------------------

def trainbench_run(root: Path, steps: int = 50, features: Features | None = None,
                   run_json: dict | None = None, exit_json: dict | None = None,
                   jsonl: bool = True, nan_at: int | None = None) -> Path:
    plan = build_plan("pretrain_llama3.1", "tiny", "bf16", 2, "cpu", steps=steps,
                      features=features)
    d = root / "experiments" / plan.name / f"{plan.name}_20250101-000000"
    d.mkdir(parents=True)
    (d / "plan.json").write_text(plan.to_json())
    rows, lines = [], []
    for i in range(steps):
        m = StepMetrics(iteration=i, total_iterations=steps, lr=3e-4, global_batch_size=8,
                        loss=float("nan") if i == nan_at else 6.0 - 0.01 * i, grad_norm=1.0,
                        step_time_s=0.5 if i == 0 else 0.1 + 0.001 * (i % 3),
                        tflops_per_gpu=0.01, tokens_per_s=1.0, peak_memory_bytes=2**30,
                        memory_allocated_bytes=2**29, consumed_samples=8 * (i + 1), time=float(i))
        rows.append(m.to_json())
        lines.append(format_step_line(m))
    if jsonl:
        (d / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    (d / f"log-{plan.name}.out").write_text("\n".join(["starting"] + lines) + "\n")
    if run_json is not None:
        (d / "run.json").write_text(json.dumps(run_json))
    if exit_json is not None:
        (d / "exit.json").write_text(json.dumps(exit_json))
    return d


def test_trainbench_cpu_run_uses_plan_and_measured_gemm_peak(tmp_path):
    d = trainbench_run(tmp_path, run_json={"device_name": "cpu", "peak_tflops": 0.05,
                                           "peak_source": "measured GEMM", "world_size": 2},
                       exit_json={"exit_code": 0, "reason": "completed"})
    r = summarize_experiment(d)
    assert (r.format, r.identity_source, r.status) == ("trainbench", "plan.json", SUCCESS)
    assert (r.workload, r.size, r.gpu_type, r.gpus, r.gbs, r.seq_len) == (
        "pretrain_llama3.1", "tiny", "cpu", 2, 8, 128)
    assert r.layout == "TP1 PP1 CP1 DP2"
    mean = sum(0.1 + 0.001 * (i % 3) for i in range(11, 45)) / 34
    assert r.step_time_mean_s == pytest.approx(mean, rel=1e-12)
    assert r.peak_source == "measured GEMM" and r.peak_tflops == 0.05
    # TFLOPS/GPU from its definition: GBS 8 sequences of 128 tokens per step over 2 ranks,
    # at the published FLOPs per sequence (flops.py is checked against the seeds elsewhere).
    per_sequence = flops_per_sequence(get_model("pretrain_llama3.1", "tiny"), 128)
    tflops = 8 * per_sequence / mean / 2 / 1e12
    assert r.tflops_per_gpu == pytest.approx(tflops, rel=1e-9)
    assert r.mfu_pct == pytest.approx(100 * tflops / 0.05, rel=1e-9)
    assert any("measured GEMM peak" in n for n in r.notes)
    assert r.peak_memory_gib == pytest.approx(1.0)
    assert r.verdict == "no reference"


def test_trainbench_log_is_read_when_metrics_jsonl_is_missing(tmp_path):
    r = summarize_experiment(trainbench_run(tmp_path, steps=20, jsonl=False))
    assert r.format == "nemo2" and r.steps_logged == 20 and r.status == SUCCESS
    assert r.mfu_pct is None  # no run.json: a CPU run has no peak to measure against
    assert any("no measured GEMM peak" in n for n in r.notes)


def test_profiled_run_is_not_comparable(tmp_path):
    r = summarize_experiment(trainbench_run(tmp_path, features=Features(profile="torch")))
    assert not r.comparable and r.verdict == "not comparable (profiled)"
    assert any("profiled run (torch)" in n for n in r.notes)


def test_trainbench_run_with_nan_loss_is_invalid(tmp_path):
    r = summarize_experiment(trainbench_run(tmp_path, nan_at=12))
    assert r.status == INVALID and r.verdict == "invalid" and r.step_time_mean_s is None


def test_nonzero_exit_code_after_the_last_step_is_reported(tmp_path):
    d = trainbench_run(tmp_path, exit_json={"exit_code": 1, "reason": "checkpoint save failed"})
    r = summarize_experiment(d)
    assert r.exit_code == 1 and "exit code 1 after the last step" in r.status_detail
    assert "checkpoint save failed" in r.status_detail
    # Never a Success: a non-zero exit code is a failure, whatever the steps say; the
    # steps' timings are still shown.
    assert r.status == FAILED and r.verdict == "failed" and r.step_time_mean_s is not None


# --- names of the seeds ---------------------------------------------------------------------

@pytest.mark.parametrize("path,expected", [
    ("experiments/pretrain_llama3.1_70b_fp8_256/pretrain_llama3.1_70b_fp8_256_1744/log-x.out",
     Identity("pretrain_llama3.1", "70b", "fp8", 256)),
    ("experiments/pretrain_nemotronh_56b_fp8_gpus128_tp8_pp1_cp1_vpNone_mbs1_gbs768/log-a.out",
     Identity("pretrain_nemotronh", "56b", "fp8", 128)),
    ("x/pretraining_nemotronh_56b_fp8_256_cfg/log-a.out",
     Identity("pretrain_nemotronh", "56b", "fp8", 256)),
    ("experiments/pretrain_llama3.1_405b-proxy_bf16_64/log-a.out",
     Identity("pretrain_llama3.1", "405b-proxy", "bf16", 64)),
    ("results/24.12/bf16/70b/64/log-maxtext-64_70b_1407993.out",
     Identity("pretrain_llama2", "70b", "bf16", 64)),
    ("results/24.11/fp8/340b/256/log-nemo.out", Identity("pretrain_nemotron4", "340b", "fp8", 256)),
    ("results/24.11/bf16/70b/64/log-run.out", Identity(None, "70b", "bf16", 64)),
    ("logs/run.out", Identity()),
])
def test_identity_from_seed_names(path, expected):
    assert infer_identity(Path(path)) == expected


def test_maxtext_format_decides_an_ambiguous_70b():
    assert infer_identity(Path("results/24.11/bf16/70b/64/log-run.out"), "maxtext").workload == (
        "pretrain_llama2")


# --- issue 16: what the summary makes of real logs (sources in tests/data/logs/README.md) ----

def test_megatron_deepspeed_excerpt_is_timed_in_seconds():
    """Defect 1: 106.5 s steps, not 0.1065 s; not Failed."""
    r = summarize_experiment(LOGS / "megatron-deepspeed" / "bigscience-tr11-176b-excerpt.log")
    assert r.format == "megatron-deepspeed" and r.status == INCOMPLETE  # an excerpt of 115311
    assert r.step_time_mean_s == pytest.approx(
        (106.46 + 105.90 + 106.40 + 106.33 + 107.53) / 5)


def test_nan_loss_in_a_nemo1_bar_makes_the_run_invalid():
    """Defect 2."""
    r = summarize_experiment(LOGS / "nemo1" / "nan-loss-progress-bar.log")
    assert r.status == INVALID and r.failure_class == "NaN/Inf"
    assert r.status_detail == "loss is nan at iteration 8998"


def test_multi_epoch_nemo2_run_is_complete():
    """Defect 3: 30 steps over three epochs, the default window over all 30."""
    r = summarize_experiment(LOGS / "nemo2" / "multi-epoch-config-echo.log")
    assert (r.status, r.steps_logged, r.last_iteration, r.total_iterations) == (
        SUCCESS, 30, 29, 30)
    # 9.80 + 0.01 * ((7 * step) % 5) for steps 7..26 (the window of a 30-step run).
    times = [9.80 + 0.01 * ((7 * s) % 5) for s in range(7, 27)]
    assert r.window == (7, 26) and r.step_time_mean_s == pytest.approx(sum(times) / 20)


def test_unknown_format_is_unrecognised_not_failed():
    """Defect 4."""
    r = summarize_experiment(LOGS / "nanochat" / "base-train.log")
    assert r.status == UNRECOGNISED and r.failure_class is None and r.verdict == "format not read"
    assert r.status_detail == "no line in a format trainbench reads"


@pytest.mark.parametrize("name, cls", [
    ("cuda-oom", "CUDA out of memory"), ("nccl-timeout", "NCCL timeout"),
    ("nccl-error", "NCCL error"), ("segfault", "segmentation fault"),
    ("rank-killed", "rank killed"), ("node-failure", "node failure"),
    ("slurm-time-limit", "Slurm time limit"), ("slurm-cancelled", "Slurm cancelled"),
])
def test_a_run_ended_by_a_known_cause_failed(name, cls):
    """Defect 5: a log that stops early with a known cause at its end failed (not merely
    Incomplete), and says which cause and where."""
    r = summarize_experiment(LOGS / "failures" / f"{name}.log")
    assert r.status == FAILED and r.failure_class == cls and r.verdict == "failed"
    assert r.status_detail.startswith("stopped at iteration 182 of 0..249999: ")
    assert r.last_error in r.status_detail


def test_nccl_watchdog_before_any_step_is_a_failure_not_an_unknown_log():
    r = summarize_experiment(LOGS / "nemo1" / "watchdog-after-progress-bar.log")
    assert r.status == FAILED and r.failure_class == "NCCL timeout"


def test_trainbench_launcher_causes_are_classified(tmp_path):
    """Defect 5 with trainbench's own launcher: exit.json's reason (launch/local.py's
    failure line) gives the class; nothing is read twice."""
    d = trainbench_run(tmp_path, exit_json={
        "exit_code": 1, "executor": "local",
        "reason": "disk full: rank 0 failed (exit code 1): OSError: [Errno 28] No space left "
                  "on device; the other ranks were stopped"})
    rows = (d / "metrics.jsonl").read_text().splitlines()
    (d / "metrics.jsonl").write_text("\n".join(rows[:20]) + "\n")
    r = summarize_experiment(d)
    assert r.status == FAILED and r.failure_class == "disk full"
    assert r.status_detail.startswith("stopped at iteration 19 of 0..49: disk full: rank 0")


def test_interleaved_ranks_keep_the_peak_memory():
    """Defect 6: 26880 MB = 26.25 GiB, the larger of the two glued reports."""
    r = summarize_experiment(LOGS / "megatron" / "interleaved-ranks.log")
    assert r.peak_memory_gib == 26.25 and r.status == SUCCESS


def test_facts_of_the_log_give_tokens_per_second_and_options_override_them():
    """Defect 7: Megatron's argument dump gives GPUs, batch and sequence length, hence
    tokens/s; the user's --scale wins over the log."""
    path = LOGS / "megatron" / "arguments-dump.log"
    r = summarize_experiment(path)
    assert (r.gpus, r.gbs, r.seq_len, r.dtype) == (8, 128, 8192, "bf16")
    assert r.layout == "TP2 PP2 CP1 DP2 (log)" and "log" in r.identity_source
    mean = (6103.8 + 6099.1 + 6101.5 + 6097.7) / 4 / 1000  # window 1-4 of 5
    assert r.step_time_mean_s == pytest.approx(mean)
    assert r.tokens_per_s == pytest.approx(128 * 8192 / mean)
    assert r.tokens_per_s_per_gpu == pytest.approx(128 * 8192 / mean / 8)
    assert summarize_experiment(path, scale=16).gpus == 16


def test_maxtext_and_nemo_facts():
    maxtext = summarize_experiment(LOGS / "maxtext" / "profiled-nsys-glog.log")
    assert (maxtext.gpus, maxtext.gbs, maxtext.seq_len) == (64, 384, 4096)
    nemo = summarize_experiment(LOGS / "nemo2" / "multi-epoch-config-echo.log")
    assert (nemo.gpus, nemo.gbs, nemo.seq_len, nemo.layout) == (
        16, 128, 8192, "TP2 PP2 CP1 DP4 (log)")


@pytest.mark.parametrize("name", ["maxtext/profiled-nsys-glog.log",
                                  "torchtitan/profiled-every-10-steps.log"])
def test_profiled_logs_are_not_comparable(name):
    """Defect 8: neither file name says nsys or profile; the log's lines do."""
    r = summarize_experiment(LOGS / name)
    assert not r.comparable
    assert any(note.startswith("profiled run (the log says") for note in r.notes)


def test_torchtitan_excerpt_without_run_length():
    """Defect 9: steps 15-21 of an unknown run length: the window is scaled to the steps
    the log holds (16-20 of 14-20), not to 0-20."""
    r = summarize_experiment(LOGS / "torchtitan" / "rank0-every-step.log")
    assert r.format == "torchtitan" and r.status == SUCCESS and r.window == (16, 20)
    assert r.step_time_mean_s == pytest.approx((1.125 + 1.119 + 1.121 + 1.127 + 1.122) / 5)
    assert r.peak_memory_gib == pytest.approx(9.46)


def test_excerpt_of_a_long_run_uses_the_steps_present():
    """Defect 10: iterations 182-185 of a 250,000-iteration run: the planned window
    55000-220000 holds none of them, so the four present are used, and the note says
    which --window to pass."""
    r = summarize_experiment(LOGS / "megatron" / "epfllm-250k-iterations-excerpt.log")
    assert r.window == (181, 184) and r.window_count == 4
    assert r.step_time_mean_s == pytest.approx(
        (126995.3 + 125553.7 + 127804.5 + 130554.9) / 4 / 1000)
    note = next(n for n in r.notes if n.startswith("the default window 55000-220000"))
    assert "--window 181-184" in note
    # A window the user gives is kept as given, even when empty.
    given = summarize_experiment(LOGS / "megatron" / "epfllm-250k-iterations-excerpt.log",
                                 window=(11, 44))
    assert given.window == (11, 44) and given.step_time_mean_s is None
