"""The CPU peak is measured on the GEMMs the model runs, and the timed step holds only the
step: batches are made on the device before the timer starts."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch

from helpers import experiment_dirs, run_cli
from trainbench.engine import data
from trainbench.engine.peak import LAYOUTS, measure_peak, model_gemms
from trainbench.planning import build_plan
from trainbench.results import summarize_experiment

# Tiny Llama 3.1: hidden 64, 4 heads x 16 (q: 64), 2 KV heads x 16 (k, v: 32), FFN 192,
# vocabulary 512, sequence 128; its recipe rows use microbatches of 2 sequences.
TOKENS = 2 * 128


def forward_shapes(plan) -> set[tuple[int, int, int]]:
    return {(g.m, g.k, g.n) for g in model_gemms(plan) if g.what.endswith("forward")}


def test_peak_gemms_are_every_linear_layer_at_the_runs_shapes():
    plan = build_plan("pretrain_llama3.1", "tiny", "fp32", 1, "cpu")
    assert forward_shapes(plan) == {
        (TOKENS, 64, 64),    # wq, and wo (64 -> 64)
        (TOKENS, 64, 32),    # wk, wv
        (TOKENS, 64, 192),   # w1, w3
        (TOKENS, 192, 64),   # w2
        (TOKENS, 64, 512),   # output
    }
    gemms = model_gemms(plan)
    # Each layer's backward GEMMs: dY @ W (tokens x out x in), dY^T @ X (out x tokens x in).
    w2 = {g.what: (g.m, g.k, g.n) for g in gemms if g.what.startswith("w2 ")}
    assert w2 == {"w2 forward": (TOKENS, 192, 64), "w2 input grad": (TOKENS, 64, 192),
                  "w2 weight grad": (64, TOKENS, 192)}
    # Every GEMM is tried in all four operand layouts; the model's own come first.
    by_gemm: dict[tuple, set[str]] = {}
    for g in gemms:
        by_gemm.setdefault((g.what, g.m, g.k, g.n), set()).add(g.layout)
    assert all(layouts == set(LAYOUTS) for layouts in by_gemm.values())
    own = gemms[:len(by_gemm)]
    assert {(g.what.split(" ", 1)[1], g.layout) for g in own} == {
        ("forward", "NT"), ("input grad", "NN"), ("weight grad", "TN")}


def test_peak_gemms_follow_tensor_and_context_parallel_shards():
    plan = build_plan("pretrain_llama3.1", "tiny", "fp32", 4, "cpu",
                      overrides={"tp": 2, "cp": 2, "dp": 1})
    tokens = TOKENS // 2  # CP halves each rank's sequence
    assert forward_shapes(plan) == {
        (tokens, 64, 32),    # wq column-parallel: 64 / 2
        (tokens, 32, 64),    # wo row-parallel: 64 / 2 inputs
        (tokens, 64, 16),    # wk, wv: 32 / 2
        (tokens, 64, 96),    # w1, w3: 192 / 2
        (tokens, 96, 64),    # w2 row-parallel
        (tokens, 64, 256),   # output, vocabulary-parallel
    }


def test_nemotronh_peak_includes_the_mamba_projections():
    plan = build_plan("pretrain_nemotronh", "tiny", "fp32", 1, "cpu")
    shapes = forward_shapes(plan)
    # Mamba-2: d_inner = 8 heads x 16 = 128; in_proj -> z, x (128 each), B, C (2 groups x
    # 16 states each) and dt (8 heads): 2*128 + 2*32 + 8 = 328; out_proj 128 -> 64.
    assert (TOKENS, 64, 328) in shapes and (TOKENS, 128, 64) in shapes


def test_measured_peak_names_a_real_model_gemm_and_the_ranks_threads():
    plan = build_plan("pretrain_llama3.1", "tiny", "bf16", 1, "cpu")
    peak = measure_peak(plan, torch.bfloat16, autocast=True)
    assert peak.tflops > 0 and peak.dtype == "bf16" and peak.autocast
    assert peak.threads == torch.get_num_threads()
    assert (peak.gemm, peak.m, peak.k, peak.n, peak.layout) in {
        (g.what, g.m, g.k, g.n, g.layout) for g in model_gemms(plan)}
    # The model's own GEMMs at least, each distinct shape and layout once.
    own = model_gemms(plan)[:len(model_gemms(plan)) // 4]
    assert peak.candidates >= len({(g.m, g.k, g.n, g.layout) for g in own})


@pytest.mark.slow
def test_bf16_run_on_this_cpu_reports_an_mfu_of_at_most_100_percent(tmp_path):
    """The case of issue 12: tiny Llama bf16 on 2 ranks printed MFU 292-341% against a
    square torch.mm "peak" on a CPU without native bf16."""
    res = run_cli("run", "-w", "pretrain_llama3.1", "-s", "tiny", "--dtype", "bf16", "--scale",
                  "2", "--gpu", "cpu", "--steps", "6", root=tmp_path, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (exp,) = experiment_dirs(tmp_path)
    run = json.loads((exp / "run.json").read_text())
    assert run["peak_source"] == "measured GEMM"
    assert run["peak_gemm"]["dtype"] == "bf16" and run["peak_gemm"]["threads"] >= 1
    r = summarize_experiment(exp)
    assert r.mfu_problem is None, r.mfu_problem
    assert 0 < r.mfu_pct <= 100
    assert "INVALID" not in res.stdout


# --- the timed step ----------------------------------------------------------------------------

@pytest.fixture
def one_rank_trainer(tmp_path, monkeypatch):
    """A real one-rank trainer in this process (gloo, world size 1)."""
    from trainbench.engine.trainer import Trainer
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port)).items():
        monkeypatch.setenv(key, value)
    plan = build_plan("pretrain_llama3.1", "tiny", "fp32", 1, "cpu", steps=2,
                      peak_tflops=1.0)  # a given peak: nothing to measure here
    trainer = Trainer(plan, Path(tmp_path) / "exp")
    trainer.setup()
    yield trainer
    trainer.close()


def test_step_batches_are_the_data_modules_microbatches_on_the_device(one_rank_trainer):
    t = one_rank_trainer
    p = t.plan
    batches = t.step_batches(3)
    assert len(batches) == p.gbs // p.mbs == 4
    for i, (inputs, labels) in enumerate(batches):
        want_in, want_lab = data.microbatch(p.seed, 3, i * p.mbs, p.mbs, p.seq_len,
                                            p.model.vocab_size)
        assert inputs.device == t.device and labels.device == t.device
        assert inputs.shape == (p.mbs, p.seq_len)
        assert torch.equal(inputs.cpu(), want_in) and torch.equal(labels.cpu(), want_lab)
    # Another step trains on other tokens.
    assert not torch.equal(t.step_batches(4)[0][0], batches[0][0])


def test_batches_are_made_before_the_step_timer_starts(one_rank_trainer, monkeypatch):
    """Spies (the real functions still run) record the order of batch generation and the
    step timer's clock reads: every microbatch is made before the timer starts."""
    import trainbench.engine.trainer as trainer_mod
    events: list[str] = []
    real_microbatch, real_time = data.microbatch, trainer_mod.time

    def microbatch(*args, **kwargs):
        events.append("batch")
        return real_microbatch(*args, **kwargs)

    class Clock:
        def __getattr__(self, name):
            return getattr(real_time, name)

        @staticmethod
        def perf_counter():
            events.append("clock")
            return real_time.perf_counter()

    monkeypatch.setattr(data, "microbatch", microbatch)
    monkeypatch.setattr(trainer_mod, "time", Clock())
    metrics = one_rank_trainer.train_step(0)
    assert events.count("batch") == 4 and events.count("clock") == 2
    assert events == ["batch"] * 4 + ["clock", "clock"]
    assert metrics.step_time_s > 0 and metrics.loss > 0
