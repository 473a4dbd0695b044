"""The project's own GPU runs (predict.project_runs) are what their logs say ran: each plan
builds, its logged shape (sequence, recompute, layers) is the one predict is given, and
its step time and peak are the logs' own figures, not a transcription error."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trainbench.planning import build_plan
from trainbench.predict.perf import predict_step
from trainbench.predict.project_runs import PROJECT_RUNS

ROOT = Path(__file__).resolve().parent.parent
H200 = [run for run in PROJECT_RUNS if run.gpu == "h200"]


@pytest.mark.parametrize("run", PROJECT_RUNS, ids=lambda run: run.name)
def test_each_run_has_its_log_and_predicts(run):
    log = ROOT / run.log_dir / run.log
    assert log.is_file(), log
    plan = build_plan(run.workload, run.size, run.dtype, 1, run.gpu, overrides=run.overrides)
    assert predict_step(plan, sharding="engine").step_time_s > 0


@pytest.mark.parametrize("run", H200, ids=lambda run: run.name)
def test_an_h200_run_is_the_plan_its_log_shows(run):
    text = (ROOT / run.log_dir / run.log).read_text()
    plan = build_plan(run.workload, run.size, run.dtype, 1, run.gpu, overrides=run.overrides)
    # gpu_moe.py: "seq 4096, MBS 1, GBS 2, recompute selective"; trainbench run's header:
    # "GBS 2  GA 2  seq 4096  steps 8  recompute selective"
    assert re.search(rf"seq {plan.seq_len}\b.*recompute {plan.recompute}\b", text), run.log
    assert re.search(rf"\b{plan.model.layers} layers\b|layers={plan.model.layers}\b", text)
    if run.metrics:  # an accept row's allocated peak, from its metrics.jsonl
        records = [json.loads(line) for line in
                   (ROOT / run.log_dir / run.metrics).read_text().splitlines() if line]
        peak = max(r["peak_allocated_bytes"] for r in records)
        assert peak / 2 ** 30 == pytest.approx(run.peak_gib, abs=0.005)
    elif run.peak_kind == "allocated":  # gpu_moe.py's table: "| ms/step | ... | peak mem GiB |"
        row = next(line for line in text.splitlines()
                   if line.startswith("| ") and f"| {run.dtype} |" in line)
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[2]) == pytest.approx(run.step_time_s * 1e3, abs=0.05)
        assert float(cells[8]) == pytest.approx(run.peak_gib, abs=0.005)
        return
    if "last iteration" in run.label:  # a window shared with another process
        last = re.findall(r"train_step_timing in s: ([\d.]+)", text)[-1]
        assert float(last) == pytest.approx(run.step_time_s, abs=5e-5)
    else:  # results' window
        assert f"{run.step_time_s:.4f} ±" in text
    if run.peak_kind == "reserved":  # the largest peak_memory_usage the run logged
        peak = max(int(b) for b in re.findall(r"peak_memory_usage: (\d+)", text))
        assert peak / 2 ** 30 == pytest.approx(run.peak_gib, abs=0.05)
