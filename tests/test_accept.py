"""`trainbench accept`: which rows run where, the one table and its findings, bad input,
and the whole command end to end on this CPU (tiny sizes), where one row's own time
limit stops it while the others go on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from helpers import processes_naming, run_cli
from trainbench.accept import AcceptError, AcceptRequest, parse_limits, plan_rows
from trainbench.accept.checks import SUCCESS, TIMED_OUT, RowResult
from trainbench.accept.machine import Machine
from trainbench.accept.proxy import resolve
from trainbench.results.predicted import predicted
from trainbench.accept.report import Report, markdown, text
from trainbench.accept.rows import FAMILIES, build_rows, check_rows, training_rows
from trainbench.catalog import hardware
from trainbench.catalog.models import WORKLOADS, get_model

CPU = Machine(device="a CPU", gpu_key="cpu", gpus=0, driver=None, torch="2.13.0",
              torchao="0.18.0", python="3.11", trainbench="0.1.0")
H100 = Machine(device="NVIDIA H100 80GB HBM3", gpu_key="h100", gpus=1, driver="580",
               torch="2.11.0", torchao="0.18.0", python="3.12", trainbench="0.1.0")


def test_every_family_runs_in_bf16_and_its_fp8_dtype_on_a_cpu():
    rows, skipped = training_rows(None, has_torchao=True, quick=False)
    assert skipped == []
    assert [r.label for r in rows] == [
        "llama3.1-bf16", "llama3.1-fp8", "llama2-bf16", "llama2-fp8", "nemotron4-bf16",
        "nemotron4-fp8", "nemotronh-bf16", "nemotronh-fp8", "qwen3-bf16", "qwen3-mxfp8",
        "deepseek_v3-bf16", "deepseek_v3-mxfp8"]
    assert {r.size for r in rows} == {"tiny"}
    assert {r.workload for r in rows} == {f.workload for f in FAMILIES} == set(WORKLOADS)
    assert [r.label for r in check_rows(None)] == ["checkpoint", "profile", "probe"]
    builds = build_rows(quick=False)
    assert [r.label for r in builds] == [f"{f.key}-build" for f in FAMILIES]
    assert [(r.size, r.settings) for r in builds] == [
        (f.size, f"{f.settings} tp=1 pp=1 cp=1 dp=1") for f in FAMILIES]


def test_without_torchao_the_fp8_rows_are_skipped_and_said_so():
    rows, skipped = training_rows(None, has_torchao=False, quick=False)
    assert all(r.dtype == "bf16" for r in rows) and len(rows) == 6
    assert len(skipped) == 6 and all("no torchao: fp8 rows skipped" in s for s in skipped)


@pytest.mark.parametrize("gpu, low", [("h100", "fp8"), ("b200", "mxfp8"), ("gb300", "mxfp8"),
                                      ("a100", None)])
def test_the_fp8_rows_take_the_gpus_own_format(gpu, low):
    rows, skipped = training_rows(hardware.GPUS[gpu], has_torchao=True, quick=False)
    lows = {r.dtype for r in rows} - {"bf16"}
    assert lows == ({low} if low else set())
    if low is None:
        assert len(skipped) == 6 and all("has no FP8 tensor cores" in s for s in skipped)


def test_the_quick_subset():
    """On a GPU the training rows build the real-width proxies; on a CPU, which trains
    the tiny sizes, build rows `check` them first."""
    rows, _ = plan_rows(AcceptRequest(quick=True), H100)
    quick = ["llama3.1-bf16", "llama3.1-fp8", "nemotronh-fp8", "deepseek_v3-bf16",
             "checkpoint", "profile", "probe"]
    assert [r.label for r in rows] == quick
    rows, _ = plan_rows(AcceptRequest(quick=True), CPU)
    assert [r.label for r in rows] == ["llama3.1-build", "nemotronh-build",
                                       "deepseek_v3-build"] + quick


def test_time_limits_and_only():
    rows, _ = plan_rows(AcceptRequest(only=("llama3.1", "probe"),
                                      time_limits=("90", "llama3.1-fp8=1", "probe=30")), CPU)
    assert {r.label: r.limit_s for r in rows} == {"llama3.1-build": 90, "llama3.1-bf16": 90,
                                                  "llama3.1-fp8": 1, "probe": 30}
    assert parse_limits(("12.5",), 180) == (12.5, {})
    for bad in ("0", "-3", "x", "=4", "probe=", "1e9"):
        with pytest.raises(AcceptError, match="--time-limit"):
            parse_limits((bad,), 180)
    with pytest.raises(AcceptError, match="--only nothing names no row"):
        plan_rows(AcceptRequest(only=("nothing",)), CPU)
    with pytest.raises(AcceptError, match="no row to run is called that"):
        plan_rows(AcceptRequest(only=("probe",), time_limits=("llama3.1=5",)), CPU)


def test_the_dense_and_hybrid_gpu_proxies_run_at_real_width_and_fit_one_h100():
    """predict (engine sharding) says each fits one H100; the Nemotron-H proxy is the
    56B's width with one Mamba-2, one MLP and one attention layer."""
    rows, _ = training_rows(hardware.GPUS["h100"], has_torchao=True, quick=False)
    for row in rows:
        ran, plan, problem = resolve(row, "h100")
        if row.workload in ("pretrain_qwen3", "pretrain_deepseek_v3") or row.label == \
                "nemotronh-bf16":
            # Where the catalog has no such recipe (the 56B is FP8 only) or the proxy may
            # not fit, the proxy runs at real width where it plans and fits, else tiny
            # with the reason in the row.
            assert problem is None and (ran == row or ran.size == "tiny" and ran.note)
            continue
        assert problem is None and ran == row, (row.label, ran.note)
        assert plan.model.hidden == get_model(row.workload, row.size).hidden
        assert plan.gpus == 1 and predicted(plan)["memory_gib"] < 78.8
        if row.workload == "pretrain_nemotronh":
            assert plan.model.pattern == "M-*"


def test_a_proxy_that_does_not_plan_falls_back_to_the_tiny_size_and_says_why():
    row = training_rows(hardware.GPUS["h100"], True, False)[0][0]
    bad = type(row)(**{**row.__dict__, "settings": row.settings + " layers=4 tp=3"})
    ran, plan, problem = resolve(bad, "h100")
    assert problem is None and ran.size == "tiny" and plan.model.hidden == 64
    assert ran.note.startswith("tiny size: the 8b proxy does not plan:")


def _result(label, step, pred_step, mem, pred_mem, status=SUCCESS):
    return RowResult(label=label, kind="train", shape="8b layers=4", dtype="bf16",
                     status=status, step_s=step, pred_step_s=pred_step, mfu_pct=50.0,
                     pred_mfu_pct=52.0, memory_gib=mem, pred_memory_gib=pred_mem)


def test_a_gap_over_15_percent_is_a_finding():
    rep = Report(machine=H100, command="trainbench accept", started="now", rows=[
        _result("a-bf16", 1.16, 1.0, 40.0, 40.0),   # 16% slow: a finding
        _result("b-bf16", 1.14, 1.0, 34.2, 40.0),   # 14% slow, 14.5% less memory: none
        _result("c-fp8", 0.8, 1.0, 50.0, 40.0),     # 20% fast, 25% more memory: two
        _result("d-fp8", 9.0, 1.0, 90.0, 40.0, status=TIMED_OUT),  # not a measurement
    ])
    assert rep.findings == [
        "a-bf16: step time 1.16 s is +16% from predict's 1 s",
        "c-fp8: step time 0.8 s is -20% from predict's 1 s",
        "c-fp8: peak memory 50 GiB is +25% from predict's 40 GiB"]
    table = text(rep)
    assert "1 x NVIDIA H100 80GB HBM3, driver 580; torch 2.11.0, torchao 0.18.0" in table
    assert "finding: c-fp8: peak memory 50 GiB" in table
    assert "0 of 4 rows succeeded" not in table and "3 of 4 rows succeeded" in table
    md = markdown(rep)
    assert "| a-bf16 | 8b layers=4 | Success | 1.16 | 1 | +16% | 50.0% | 52.0% | 40 | 40 | +0% |" \
        in md
    data = json.loads(rep.to_json())
    assert data["format"] == "trainbench-acceptance" and len(data["findings"]) == 3
    assert data["machine"]["device"] == "NVIDIA H100 80GB HBM3"


def test_bad_input_is_one_line_and_creates_nothing(tmp_path):
    (tmp_path / "taken").mkdir()
    for args in (["--out", str(tmp_path / "taken")], ["--only", "nothing"], ["--only", ","],
                 ["--time-limit", "soon"], ["--steps", "0"]):
        res = run_cli("accept", *args, root=tmp_path)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1, (args, res.stderr)
        assert lines[0].startswith("trainbench: error: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    assert not any((tmp_path / "taken").iterdir())


@pytest.mark.slow
@pytest.mark.dist
def test_the_quick_acceptance_run_end_to_end_on_a_cpu(tmp_path):
    """The quick subset's Llama 3.1 rows (its real-width proxy built with `check`, its
    tiny size trained), the checkpoint, profile and probe rows through the real CLI, 2
    steps each; the FP8 row's own 1 s limit stops it (a run takes about 10 s to start)
    and the rows after it still run."""
    out = tmp_path / "acceptance"
    res = run_cli("accept", "--quick", "--only", "llama3.1,checkpoint,profile,probe",
                  "--time-limit", "llama3.1-fp8=1", "--out", str(out), root=tmp_path,
                  timeout=900)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]  # one row timed out
    assert "no GPU found: tiny sizes on the CPU" in res.stdout
    data = json.loads((out / "acceptance.json").read_text())
    status = {r["label"]: r["status"] for r in data["rows"]}
    assert status == {"llama3.1-build": SUCCESS, "llama3.1-bf16": SUCCESS,
                      "llama3.1-fp8": TIMED_OUT, "checkpoint": SUCCESS, "profile": SUCCESS,
                      "probe": SUCCESS}
    rows = {r["label"]: r for r in data["rows"]}
    cut = rows["llama3.1-fp8"]
    assert cut["limit_s"] == 1 and cut["seconds"] < 20
    assert "stopped at its own 1 s limit" in cut["detail"]
    bf16 = rows["llama3.1-bf16"]
    assert bf16["step_s"] > 0 and bf16["mfu_pct"] > 0 and bf16["memory_gib"] > 0
    assert rows["checkpoint"]["detail"].startswith("saved at iteration 2")
    assert "iteration 2 profiled" in rows["profile"]["detail"]
    assert "best GEMM TFLOPS" in rows["probe"]["detail"]
    # The 8B's width cut to 4 layers: embedding and head (vocabulary 128,256 x 4096), 4
    # blocks (q and out 4096 x 4096, k and v 4096 x 1024, SwiGLU 3 x 4096 x 14336, two
    # norms) and the final norm.
    block = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    params = 2 * 128256 * 4096 + 4 * block + 4096
    assert f"{params:,} parameters" in rows["llama3.1-build"]["detail"]
    md = (out / "acceptance.md").read_text()
    for label in status:
        assert f"| {label} |" in md
    table = res.stdout[res.stdout.index("run  "):]
    assert all(label in table for label in status)
    assert "5 of 6 rows succeeded" in table
    assert sorted(p.name for p in (out / "logs").iterdir()) == sorted(
        f"{label}.log" for label in status)
    assert processes_naming(str(out)) == []  # the stopped run left nothing behind


def test_a_gpu_rows_memory_is_its_allocated_peak_beside_the_reserved_one(tmp_path):
    """A GPU run's metrics.jsonl records the allocator's peak of allocated bytes each step
    (engine/step_metrics.py): accept compares that with predict, which counts allocated
    bytes, and lists the reserved peak beside it."""
    from trainbench.engine.log import StepMetrics
    from trainbench.results.metrics_jsonl import read_metrics_jsonl
    from trainbench.results.predicted import allocated_peak_gib

    def step(i: int, allocated: int | None) -> str:
        return StepMetrics(iteration=i, total_iterations=3, lr=1e-4, global_batch_size=2,
                           loss=5.0, grad_norm=1.0, step_time_s=0.3, tflops_per_gpu=400.0,
                           tokens_per_s=1e4, peak_memory_bytes=55 * 2**30,
                           memory_allocated_bytes=23 * 2**30, consumed_samples=2 * (i + 1),
                           time=0.0, peak_allocated_bytes=allocated).to_json()
    (tmp_path / "metrics.jsonl").write_text(
        "\n".join([step(0, 40 * 2**30), step(1, 44 * 2**30), "not json", step(2, None)]) + "\n")
    assert allocated_peak_gib(read_metrics_jsonl(tmp_path / "metrics.jsonl").records) == 44.0
    (tmp_path / "cpu.jsonl").write_text(step(0, None) + "\n")
    assert allocated_peak_gib(read_metrics_jsonl(tmp_path / "cpu.jsonl").records) is None

    row = _result("llama3.1-fp8", 0.28, 0.26, 44.0, 41.9)
    row.memory_reserved_gib = 51.3
    rep = Report(machine=H100, command="trainbench accept", started="now", rows=[row])
    assert rep.findings == []  # 44 against 41.9: +5%; the reserved 51.3 would be +22%
    assert "llama3.1-fp8: peak 44 GiB allocated, 51.3 GiB reserved by the allocator" in text(rep)


def test_an_acceptance_run_killed_outright_takes_its_running_command_with_it(tmp_path):
    """SIGKILL (a lease's `timeout -k`) cannot be caught, so the acceptance run cannot stop
    the command it runs. The kernel tells the command instead (PR_SET_PDEATHSIG): it stops
    its ranks as on SIGTERM, and nothing of the killed run holds the device for the next
    job (on one H200 a probe left so shared its GPU with the next run)."""
    out = tmp_path / "acceptance"
    env = {**os.environ, "TRAINBENCH_ROOT": str(tmp_path),
           "TRAINBENCH_CONFIG": str(tmp_path / "cluster.yaml")}
    accept = subprocess.Popen(
        [sys.executable, "-m", "trainbench.cli", "accept", "--only", "llama3.1-bf16",
         "--steps", "1000", "--out", str(out)], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not [p for p in processes_naming(str(out)) if "trainbench.engine" in p]:
        assert accept.poll() is None and time.monotonic() < deadline, "no rank started"
        time.sleep(0.5)
    accept.kill()
    accept.wait()
    deadline = time.monotonic() + 60
    while processes_naming(str(out)):
        assert time.monotonic() < deadline, processes_naming(str(out))
        time.sleep(0.5)
    # Stopped by that SIGTERM, not left to train its 1,000 steps alone.
    (exit_file,) = out.rglob("exit.json")
    assert json.loads(exit_file.read_text())["reason"].startswith("interrupted by SIGTERM")
