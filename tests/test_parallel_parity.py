"""Every parallel layout trains exactly like one process (real gloo ranks via the CLI).

Each tiny model runs 3 steps at GBS 8, MBS 2, fp32: once on one process, then under
each layout. The synthetic batch depends only on the seed and the sample index and the
CPU initialisation is the seed's full model, so every run starts from the same weights
on the same tokens. Per-step losses and gradient norms must agree.
"""

from __future__ import annotations

import json

import pytest

from helpers import losses, read_metrics, train

pytestmark = pytest.mark.dist

# fp32 on a CPU: layouts differ from one process only in the order of floating-point
# sums (sharded matmuls, reductions, the masked CP softmax), a few 1e-7 relative.
PARITY_RTOL = 1e-5

TWO_RANK_LAYOUTS = ["tp=2", "pp=2", "pp=2 vp=2", "cp=2"]
# All four model-parallel dims at once (the shape of the Llama 3.1 70B/405B recipes).
COMBINED = {"pretrain_llama3.1": "tp=2 pp=2 cp=2 vp=2"}
FAMILIES = ["pretrain_llama3.1", "pretrain_nemotron4"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """workload -> (losses, grad norms) of the single-process run, computed once."""
    root = tmp_path_factory.mktemp("one")
    cache: dict[str, tuple[list[float], list[float]]] = {}

    def get(workload: str):
        if workload not in cache:
            exp = train(root, workload, 1, steps=3)
            cache[workload] = (losses(exp), [r["grad_norm"] for r in read_metrics(exp)])
        return cache[workload]
    return get


def assert_same_training(exp, reference):
    ref_losses, ref_norms = reference
    assert len(losses(exp)) == 3
    assert losses(exp) == pytest.approx(ref_losses, rel=PARITY_RTOL)
    assert [r["grad_norm"] for r in read_metrics(exp)] == pytest.approx(ref_norms,
                                                                       rel=PARITY_RTOL)


@pytest.mark.parametrize("workload", FAMILIES)
@pytest.mark.parametrize("layout", TWO_RANK_LAYOUTS)
def test_two_rank_layout_matches_one_process(tmp_path, one_process, workload, layout):
    exp = train(tmp_path, workload, 2, "--set", layout, steps=3)
    assert_same_training(exp, one_process(workload))
    parallel = json.loads((exp / "run.json").read_text())["parallel"]
    if "pp=2" in layout:
        vp = 2 if "vp=2" in layout else 1
        assert parallel["pipeline_schedule"] == ("Interleaved1F1B" if vp == 2 else "1F1B")
        assert len(parallel["stage_layers"]) == 2 * vp
        assert parallel["microbatches_per_step"] == 4


# Nemotron-4's TP x PP x DP on eight ranks runs in FP8 against one FP8 process
# (tests/test_fp8.py, its 340B seed layout); fp32 checks Llama's four-way composition.
@pytest.mark.parametrize("workload", ["pretrain_llama3.1"])
def test_combined_layout_on_eight_ranks_matches_one_process(tmp_path, one_process, workload):
    exp = train(tmp_path, workload, 8, "--set", COMBINED[workload], steps=3)
    assert_same_training(exp, one_process(workload))
    info = json.loads((exp / "run.json").read_text())
    assert info["world_size"] == 8
    parallel = info["parallel"]
    assert parallel["tp"] == parallel["pp"] == 2
    assert parallel["tp"] * parallel["pp"] * parallel["cp"] * parallel["dp"] == 8


def test_nemotronh_mamba_tensor_parallel_matches_one_process(tmp_path, one_process):
    """Mamba-2 mixers split by heads and groups (TP2) train like one process."""
    exp = train(tmp_path, "pretrain_nemotronh", 2, "--set", "tp=2", steps=3)
    assert_same_training(exp, one_process("pretrain_nemotronh"))
