"""Every trainbench GPU run checks predict: `results` (and so every `run`'s closing table)
puts predict's step time and peak memory for the run's own plan beside the measured ones,
and names a gap over 15% as a finding. The runs are this project's own, as one H200
wrote them (docs/gpu-runs/, torch 2.11)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from trainbench.planning import load_plan
from trainbench.predict.perf import predict_step
from trainbench.results.summary import summarize_experiment

from helpers import train

ROOT = Path(__file__).resolve().parent.parent
H200_27 = ROOT / "docs/gpu-runs/2026-11-27-h200"
H200_28 = ROOT / "docs/gpu-runs/2026-11-28-h200"


def _run_dir(base: Path, row: str) -> Path:
    (found,) = (base / "runs" / row / "experiments").glob("*/*")
    return found


def _allocated_peak_gib(run: Path) -> float:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return max(json.loads(line)["peak_allocated_bytes"] for line in lines) / 2**30


def test_a_gpu_run_is_compared_with_predict_for_the_scan_it_ran():
    """Nemotron-H 56B's bf16 proxy planned ssd_scan=auto and ran the torch scan
    (mamba_ssm was not on the image; run.json says so): predict's figure is the torch
    scan's, and the memory is compared as allocated bytes, which the run recorded."""
    run = _run_dir(H200_28 / "accept_dense", "nemotronh-bf16")
    plan = load_plan(run / "plan.json")
    assert plan.ssd_scan == "auto"
    assert json.loads((run / "run.json").read_text())["ssd_scan"].startswith("torch")
    r = summarize_experiment(run)
    torch_scan = predict_step(replace(plan, ssd_scan="torch"), sharding="engine")
    assert r.predicted_step_time_s == pytest.approx(torch_scan.step_time_s)
    assert r.predicted_step_time_s != pytest.approx(
        predict_step(plan, sharding="engine").step_time_s)
    assert r.step_time_vs_predicted_pct == pytest.approx(
        100 * (r.step_time_mean_s / torch_scan.step_time_s - 1))
    assert r.predicted_memory_basis == "allocated"
    assert r.memory_vs_predicted_pct == pytest.approx(
        100 * (_allocated_peak_gib(run) / torch_scan.memory.total_gib - 1))
    # Within 15% on both: no finding.
    assert abs(r.step_time_vs_predicted_pct) < 15 and abs(r.memory_vs_predicted_pct) < 15
    assert not [n for n in r.notes if n.startswith("finding:")]


def test_a_gap_over_15_percent_is_a_finding_and_a_reserved_peak_says_so():
    """The Nemotron-H FP8 proxy of 2026-11-27 ran 0.563 s a step against predict's
    0.42 s, and logged only the reserved peak (84.5 GiB)."""
    r = summarize_experiment(_run_dir(H200_27 / "accept_fp8", "nemotronh-fp8"))
    assert r.step_time_vs_predicted_pct > 15
    assert r.predicted_memory_basis == "reserved"
    findings = [n for n in r.notes if n.startswith("finding:")]
    assert len(findings) == 2
    assert findings[0].startswith(f"finding: step time {r.step_time_mean_s:.4g} s is "
                                  f"+{r.step_time_vs_predicted_pct:.0f}% from predict's")
    assert "peak memory (reserved) 84.46 GiB" in findings[1]


def test_a_profiled_gpu_run_and_a_cpu_run_get_no_prediction(tmp_path):
    """A profiled run's timings are not comparable; a CPU run has no step-time model and
    its peak is a resident set the memory model does not describe."""
    profiled = summarize_experiment(_run_dir(H200_28 / "accept_checks", "profile"))
    assert profiled.status == "Success" and not profiled.comparable
    assert profiled.predicted_step_time_s is None
    cpu = summarize_experiment(train(tmp_path, "pretrain_llama3.1", 1, dtype="bf16"))
    assert cpu.status == "Success" and cpu.step_time_mean_s is not None
    assert (cpu.predicted_step_time_s, cpu.predicted_memory_gib) == (None, None)
    assert not [n for n in cpu.notes if n.startswith("finding:")]


@pytest.mark.parametrize("field, value", [
    ("layers", 10**12),   # a per-layer walk of predict would not end
    ("heads", 0),         # predict would divide by it
    ("hidden", 10**400),  # beyond a float: no FLOPs count either
    ("layers", -5),       # a negative TFLOPS
    ("layers", "x"),
])
def test_a_plan_json_edited_past_what_a_plan_can_be_gets_no_prediction(tmp_path, field,
                                                                        value):
    """results reads whatever directory it is given: a run whose plan.json was edited to
    sizes no model has is summarised from its steps, without a prediction, at once."""
    run = tmp_path / "run"
    shutil.copytree(_run_dir(H200_28 / "accept_dense", "nemotron4-bf16"), run)
    plan = json.loads((run / "plan.json").read_text())
    plan["model"][field] = value
    (run / "plan.json").write_text(json.dumps(plan))
    r = summarize_experiment(run)
    assert r.status == "Success" and r.step_time_mean_s is not None
    assert (r.predicted_step_time_s, r.predicted_memory_gib) == (None, None)
    # No FLOPs count from it, nor the catalog's whole model: the log's own TFLOPS.
    assert r.tflops_source == "log" and r.tflops_per_gpu > 0
    assert any(n.startswith("plan.json's model has sizes no model has") for n in r.notes)


def test_a_run_that_died_before_its_first_step_gets_predicts_figures_and_no_gap(tmp_path):
    """The same H200 run's directory as a run that ended before any step (no
    metrics.jsonl, a failed exit): predict's figures for its plan stand beside the
    failure, with no gap and no finding."""
    run = tmp_path / "run"
    shutil.copytree(_run_dir(H200_28 / "accept_dense", "nemotron4-bf16"), run)
    (run / "metrics.jsonl").unlink()
    for log in run.glob("log-*.out"):
        log.write_text("torch.OutOfMemoryError: CUDA out of memory.\n")
    exit_record = json.loads((run / "exit.json").read_text())
    exit_record.update(exit_code=1, reason="a rank failed")
    (run / "exit.json").write_text(json.dumps(exit_record))
    r = summarize_experiment(run)
    assert r.status == "Failed"
    plan = load_plan(run / "plan.json")
    assert r.predicted_step_time_s == pytest.approx(
        predict_step(plan, sharding="engine").step_time_s)
    assert r.step_time_vs_predicted_pct is None and r.memory_vs_predicted_pct is None
    assert not [n for n in r.notes if n.startswith("finding:")]
