"""Profiling and the communication summary, on real gloo ranks through the CLI.

FSDP's traffic is checked against the model's parameter count. Per step, with GA
microbatches: each transformer block but the last is all-gathered twice per microbatch
(forward, and again for backward since blocks reshard after forward); the last block and
the root unit (embedding, final norm, output head) once (they stay gathered through
backward, which starts right after their forward); every unit's gradients
are reduce-scattered once per microbatch in fp32 (the reduce dtype). Message sizes
are full buffers (all-gather output, reduce-scatter input).
"""

from __future__ import annotations

import json
import re

import pytest

from trainbench.results.summary import summarize_experiment

from helpers import read_metrics, run_cli, train

WORKLOAD = "pretrain_llama3.1"
# FSDP2 pads each parameter's first dimension to a multiple of the group size; the tiny
# model's dimensions are even, so the byte counts are exact up to this tolerance.
BYTES_RTOL = 0.01


def param_counts(tp: int = 1) -> tuple[int, int]:
    """(parameters of one block, of the root unit) held by one TP rank: TP splits the
    matrices (2-D) and replicates the norms (1-D)."""
    import torch

    from trainbench.catalog.models import get_model
    from trainbench.engine.models import build_model

    with torch.device("meta"):
        model = build_model(get_model(WORKLOAD, "tiny"))

    def local(params) -> int:
        return sum(p.numel() // tp if p.ndim >= 2 else p.numel() for p in params)
    block = local(model.layers["0"].parameters())
    root = local(p for name, p in model.named_parameters() if not name.startswith("layers."))
    return block, root


def collective(summary: dict, op: str, group: str) -> dict:
    (row,) = [r for r in summary["collectives"] if r["op"] == op and r["group"] == group]
    return row


@pytest.mark.dist
def test_profiled_run_traces_only_the_requested_steps(tmp_path):
    # 6 steps: the results' window is iterations 1-5; 3-4 are profiled and 2 is
    # torch.profiler's warm-up, so 1 and 5 are the unprofiled steps the overhead compares with.
    exp = train(tmp_path, WORKLOAD, 2, "--profile", "torch", "--profile-steps", "3-4",
                "--profile-ranks", "all", steps=6)
    for rank in (0, 1):
        trace = json.loads((exp / "profile" / f"trace-rank{rank}.pt.trace.json").read_text())
        events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        marks = {e["name"]: e for e in events if e["name"].startswith("ProfilerStep#")}
        assert sorted(marks) == ["ProfilerStep#3", "ProfilerStep#4"]
        main = marks["ProfilerStep#3"]["tid"]
        windows = [(m["ts"], m["ts"] + m["dur"]) for m in marks.values()]
        ops = [e for e in events if e["cat"] == "cpu_op" and e["tid"] == main]
        assert ops and all(any(a <= e["ts"] <= b for a, b in windows) for e in ops)

    log = (exp / "log-pretrain_llama3.1_tiny_fp32_gpus2.out").read_text()
    assert "Profile of iterations 3-4, rank 0: trace profile/trace-rank0.pt.trace.json" in log
    assert re.search(r"time: compute \d+\.\d% \| communication \d+\.\d% \(exposed", log)
    assert re.search(r"\n  aten::mm +\d+\.\d +\d+\.\d{3}\n", log)  # a top-operator row
    assert "Collectives per step, rank 0 (gloo, iterations 3-4" in log

    summary = json.loads((exp / "profile" / "summary.json").read_text())
    shares = summary["ranks"]["0"]["time_shares"]
    assert shares["compute_pct"] + shares["exposed_communication_pct"] + shares["idle_pct"] \
        == pytest.approx(100, abs=0.01)
    assert summary["ranks"]["1"]["top_ops"]

    # Results know the run was profiled: plan.json says so, and so does run.json.
    assert json.loads((exp / "plan.json").read_text())["features"]["profile"] == "torch"
    assert json.loads((exp / "run.json").read_text())["profiled"] is True
    res = run_cli("results", str(exp), "-f", "json", root=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "profiled run (torch)" in res.stdout

    # The profiler's overhead (issue 17 item 6): the profiled steps against the window's
    # unprofiled ones, the warm-up step left out.
    times = {r["iteration"]: r["step_time_s"] for r in read_metrics(exp)}
    expected = 100 * ((times[3] + times[4]) / 2 / ((times[1] + times[5]) / 2) - 1)
    result = summarize_experiment(exp)
    assert result.profiling_overhead_pct == pytest.approx(expected)
    assert "2 unprofiled step(s)" in result.profiling_overhead
    assert "warm-up step 2 left out" in result.profiling_overhead
    assert not result.comparable
    (row,) = json.loads(res.stdout)["experiments"]
    assert row["profiling_overhead_pct"] == pytest.approx(expected)
    table = run_cli("results", str(exp), root=tmp_path)
    assert f"{expected:+.1f}%: profiled iterations 3-4" in " ".join(table.stdout.split())

    # FSDP's traffic against the parameter count (fp32: 4 bytes an element).
    comm = json.loads((exp / "comm_summary.json").read_text())["ranks"]["0"]
    block, root = param_counts()
    layers, ga = 4, 2
    gather = collective(comm, "all_gather", "dp")
    assert gather["bytes_per_step"] == pytest.approx(ga * ((2 * layers - 1) * block + root) * 4,
                                                     rel=BYTES_RTOL)
    assert gather["calls_per_step"] == ga * 2 * layers  # 2 * layers - 1 blocks, 1 root
    scatter = collective(comm, "reduce_scatter", "dp")
    assert scatter["bytes_per_step"] == pytest.approx(ga * (layers * block + root) * 4,
                                                      rel=BYTES_RTOL)
    assert gather["time_per_step_s"] > 0 and scatter["time_per_step_s"] > 0


@pytest.mark.dist
def test_zero_stages_gather_and_reduce_as_often_as_they_say(tmp_path):
    """dp_sharding on DP2 with 2 microbatches a step. gradients (ZeRO-2) and optimizer
    (ZeRO-1) gather each unit's weights once a step, not for every forward and backward;
    optimizer also reduce-scatters its gradients once, not every microbatch. The same
    gradients are summed in another order, so the losses and grad norms agree with the
    default's (ZeRO-3) to fp32 rounding."""
    full = train(tmp_path, WORKLOAD, 2, "--nccl-trace", steps=2)
    kept = train(tmp_path, WORKLOAD, 2, "--nccl-trace", "--set", "dp_sharding=gradients",
                 steps=2)
    once = train(tmp_path, WORKLOAD, 2, "--nccl-trace", "--set", "dp_sharding=optimizer",
                 steps=2)
    info = json.loads((once / "run.json").read_text())["fsdp"]
    assert (info["dp_sharding"], info["gradients_reduced"]) == ("optimizer", "once a step")
    assert info["reshard_after_forward"] == "none; root kept gathered"
    info = json.loads((kept / "run.json").read_text())["fsdp"]
    assert (info["dp_sharding"], info["gradients_reduced"]) == ("gradients", "every microbatch")
    block, root = param_counts()
    layers, ga = 4, 2
    for exp, gathers, reductions in ((full, ga * 2 * layers, ga * (layers + 1)),
                                     (kept, layers + 1, ga * (layers + 1)),
                                     (once, layers + 1, layers + 1)):
        comm = json.loads((exp / "comm_summary.json").read_text())["ranks"]["0"]
        assert collective(comm, "all_gather", "dp")["calls_per_step"] == gathers
        scatter = collective(comm, "reduce_scatter", "dp")
        assert scatter["calls_per_step"] == reductions
        assert scatter["bytes_per_step"] == pytest.approx(
            reductions // (layers + 1) * (layers * block + root) * 4, rel=BYTES_RTOL)
    reference, *others = [read_metrics(exp) for exp in (full, kept, once)]
    for metrics in others:
        for key in ("loss", "grad_norm"):
            assert [m[key] for m in metrics] == pytest.approx([m[key] for m in reference],
                                                              rel=1e-5)


@pytest.mark.dist
def test_comm_summary_of_dp2_tp2_names_each_dimension(tmp_path):
    dry = run_cli("run", "-w", WORKLOAD, "-s", "tiny", "--scale", "4", "--set", "tp=2",
                  "--gpu", "cpu", "--nccl-trace", "--dry-run", root=tmp_path)
    assert dry.returncode == 0 and "steps 5" in dry.stdout  # cut to 5 steps, as the seeds

    exp = train(tmp_path, WORKLOAD, 4, "--set", "tp=2", "--nccl-trace", steps=1, dtype="bf16")
    data = json.loads((exp / "comm_summary.json").read_text())
    assert sorted(data["ranks"]) == ["0", "1", "2", "3"]
    comm = data["ranks"]["0"]
    block, root = param_counts(tp=2)
    layers, ga = 4, 2
    # FSDP over the data-parallel ranks, on TP-local shards: bf16 gathers, fp32 reduction.
    gather = collective(comm, "all_gather", "dp")
    assert gather["dtype"] == "bf16" and gather["group_size"] == 2
    assert gather["bytes_per_step"] == pytest.approx(ga * ((2 * layers - 1) * block + root) * 2,
                                                     rel=BYTES_RTOL)
    scatter = collective(comm, "reduce_scatter", "dp")
    assert scatter["dtype"] == "fp32"
    assert scatter["bytes_per_step"] == pytest.approx(ga * (layers * block + root) * 4,
                                                      rel=BYTES_RTOL)
    # Sequence parallelism: TP all-gathers and reduce-scatters whole microbatch
    # activations [MBS, seq, hidden] in bf16.
    activation = 2 * 128 * 64 * 2
    for op in ("all_gather", "reduce_scatter"):
        row = collective(comm, op, "tp")
        assert row["group_size"] == 2 and row["calls_per_step"] >= ga * layers * 4
        assert row["min_message_bytes"] == row["max_message_bytes"] == activation

    log = (exp / "log-pretrain_llama3.1_tiny_bf16_gpus4.out").read_text()
    assert "Collectives per step, rank 0 (gloo, iterations 0-0" in log
    assert re.search(r"\n  all_gather +tp +2  bf16 ", log)
    assert re.search(r"\n  reduce_scatter dp +2  fp32 ", log)
    assert not list(exp.glob(".comm-trace-*"))  # the raw traces are not kept


def test_profiling_input_is_checked_before_anything_launches(tmp_path):
    for args, needle in [
        (["--profile", "nsys"], "--profile nsys needs a GPU"),
        (["--profile", "torch", "--profile-steps", "20-25", "--steps", "10"],
         "are not all in the run (iterations 0-9)"),
        (["--profile", "torch", "--profile-ranks", "2"], "ranks must be in 0-1"),
        (["--profile", "torch", "--nccl-trace"], "mutually exclusive"),
    ]:
        res = run_cli("run", "-w", WORKLOAD, "-s", "tiny", "--gpu", "cpu", "--scale", "2",
                      *args, root=tmp_path)
        assert res.returncode == 2, (args, res.stderr)
        assert needle in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "experiments").exists()
