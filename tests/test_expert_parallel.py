"""Expert parallelism (issue 20 item 2): the routed experts split over ep ranks,
tokens dispatched and combined with all_to_all_single, trained by real gloo ranks
through the CLI and compared with one process; with tensor, pipeline and context
parallelism too.

Tolerances. Losses and gradient norms agree with one process to 1e-5 relative (fp32:
only the order of sums differs). The balance loss's gradient is scaled like each
microbatch's loss (1 / microbatches per rank), so it weighs the same in every layout;
unscaled, it weighed 1/dp as much under data parallelism and moved the norm by up to
1.4e-4 at dp=4. Expert gradients summed over the ep group but not divided by ep move it
by 7e-3 (measured: 0.4717 for 0.4684 at step 1); Adam hides that from the losses.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch

from helpers import leave_spawned_rank, losses, read_metrics, train
from trainbench.plan import PlanError
from trainbench.planning import build_plan

LOSS_RTOL = 1e-5
NORM_RTOL = 1e-5
# Under a pipeline the schedule divides the accumulated gradients by the microbatch
# count, so the balance loss's gradient must not also be divided by it: with that
# double division the PP2 norm moved by 2.1e-6 (tiny Qwen3, step 0), with it right by
# 6e-8 at most. Pipeline layouts are held to 1e-6.
PP_NORM_RTOL = 1e-6


def test_bad_expert_parallel_layouts_are_refused():
    with pytest.raises(PlanError, match="ep=4 does not divide tp x cp x dp = 1 x 1 x 2 = 2, "
                                        "the ranks of a pipeline stage"):
        build_plan("pretrain_qwen3", "tiny", "fp32", 2, "cpu", overrides={"ep": 4})
    # EP spans the tensor and context ranks too (Megatron-Core's ETP 1 layout).
    assert build_plan("pretrain_qwen3", "tiny", "fp32", 4, "cpu",
                      overrides={"ep": 4, "tp": 2}).layout.describe() == "TP2 PP1 CP1 DP2 EP4"
    with pytest.raises(PlanError, match="has no experts"):
        build_plan("pretrain_llama3.1", "tiny", "fp32", 2, "cpu", overrides={"ep": 2})
    tiny_experts = build_plan("pretrain_qwen3", "tiny", "fp32", 1, "cpu").model.n_routed_experts
    bad = next(n for n in range(2, 64) if tiny_experts % n)
    with pytest.raises(PlanError, match=f"{tiny_experts} routed experts do not split over "
                                        f"ep={bad}"):
        build_plan("pretrain_qwen3", "tiny", "fp32", bad, "cpu",
                   overrides={"ep": bad, "dp": bad, "gbs": 8 * bad})
    plan = build_plan("pretrain_qwen3", "tiny", "fp32", 4, "cpu", overrides={"ep": 2})
    assert (plan.layout.dp, plan.layout.ep) == (4, 2)
    assert plan.layout.describe() == "TP1 PP1 CP1 DP4 EP2"


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    exp = train(tmp_path_factory.mktemp("one"), "pretrain_qwen3", 1, steps=3)
    return losses(exp), [r["grad_norm"] for r in read_metrics(exp)]


def assert_trains_like_one_process(exp, reference, norm_rtol=NORM_RTOL):
    """The first 3 steps (a run may go on to save a later checkpoint)."""
    ref_losses, ref_norms = reference
    assert len(losses(exp)) >= 3
    assert losses(exp)[:3] == pytest.approx(ref_losses, rel=LOSS_RTOL)
    assert [r["grad_norm"] for r in read_metrics(exp)][:3] == pytest.approx(ref_norms,
                                                                           rel=norm_rtol)


@pytest.fixture(scope="module")
def ep2(tmp_path_factory):
    """EP2 (ep=2 over dp=2) for 4 steps, saving checkpoints at steps 2 and 4: the parity
    run and the source of the resharding test."""
    return train(tmp_path_factory.mktemp("ep2"), "pretrain_qwen3", 2, "--set", "ep=2",
                 "--checkpoint-interval", "2", steps=4)


# layout id -> (ranks, CLI settings, run.json's layout line)
LAYOUTS = {
    "ep2": (2, ("--set", "ep=2"), "TP1 PP1 CP1 DP2 EP2"),
    "ep2xdp2": (4, ("--set", "ep=2"), "TP1 PP1 CP1 DP4 EP2"),
    "tp2": (2, ("--set", "tp=2"), "TP2 PP1 CP1 DP1"),
    "ep4xtp2": (4, ("--set", "ep=4", "--set", "tp=2"), "TP2 PP1 CP1 DP2 EP4"),
    "ep2xpp2": (4, ("--set", "ep=2", "--set", "pp=2"), "TP1 PP2 CP1 DP2 EP2"),
    "ep2xcp2": (2, ("--set", "ep=2", "--set", "cp=2"), "TP1 PP1 CP2 DP1 EP2"),
}


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_parallel_moe_layouts_train_like_one_process(tmp_path, one_process, ep2, layout):
    """ep2: each rank holds half the experts, no FSDP over them. ep2xdp2: two expert
    groups, each expert FSDP-sharded over the 2 ranks holding it. tp2: attention split
    by heads, sequence parallel; the MoE layer token-local (tp.MoETokenLocal): each TP
    rank routes its own sequence shard through whole experts, whose gradients FSDP
    reduces over the TP ranks too. ep4xtp2: one expert group of all 4 ranks, 2 tensor x
    2 data (Megatron-Core's ETP 1 layout): each rank dispatches its own tokens.
    ep2xpp2: each pipeline stage's MoE layers dispatch over the stage's two data ranks.
    ep2xcp2: the expert group is the 2 context ranks, each holding half of every
    sequence; the balance loss counts the experts' tokens over both halves."""
    scale, settings, described = LAYOUTS[layout]
    exp = ep2 if layout == "ep2" else train(tmp_path, "pretrain_qwen3", scale, *settings,
                                            steps=3)
    assert_trains_like_one_process(exp, one_process,
                                   PP_NORM_RTOL if "pp" in layout else NORM_RTOL)
    info = json.loads((exp / "run.json").read_text())
    assert info["layout"] == described
    assert info["world_size"] == scale


@pytest.mark.slow
@pytest.mark.dist
def test_mxfp8_experts_train_under_ep_over_cp_like_one_mxfp8_process(tmp_path):
    """MXFP8 (torchao's MX grouped GEMM for the experts, MX linears elsewhere, the
    router kept in bf16; emulated on a CPU) in one process and under EP2 over CP2: the
    same losses and norms within the FP8 parity bounds of tests/test_fp8.py (losses
    1e-4, norms 3e-3; the layouts differ in the order of sums and in the rows each
    expert's blocks of 32 are cut from). Measured: losses within 2.0e-5, norms 1.2e-3.
    (Under TP2 the tiny model's k and v projections, 32 wide after the split, stay in
    bf16, so a TP layout runs other numbers: EP4 over TP2 x DP2 was 1.8e-3 off in norm.)"""
    one = train(tmp_path, "pretrain_qwen3", 1, dtype="mxfp8", steps=3)
    ep = train(tmp_path, "pretrain_qwen3", 2, "--set", "ep=2 cp=2", dtype="mxfp8", steps=3)
    assert losses(ep) == pytest.approx(losses(one), rel=1e-4)
    assert [r["grad_norm"] for r in read_metrics(ep)] == pytest.approx(
        [r["grad_norm"] for r in read_metrics(one)], rel=3e-3)
    for exp in (one, ep):
        fp8 = json.loads((exp / "run.json").read_text())["fp8"]
        assert fp8["float8_expert_layers"] == 4
        assert fp8["expert_recipe"] == "mxfp8 (torchao grouped GEMM)"
        assert all(name.endswith("router") or name == "output" for name in fp8["kept_in_bf16"])
    # The quantisation really ran: bf16's first gradient norm is 7e-4 away (measured).
    bf16 = train(tmp_path, "pretrain_qwen3", 1, dtype="bf16", steps=1)
    assert read_metrics(bf16)[0]["grad_norm"] != pytest.approx(
        read_metrics(one)[0]["grad_norm"], rel=2e-4)


def resume_and_compare(tmp_path, workload: str, scale: int, uninterrupted):
    """Resume `uninterrupted`'s step-2 checkpoint on `scale` ranks for steps 2-3 and
    assert they are the uninterrupted run's; returns the resumed experiment."""
    resumed = train(tmp_path, workload, scale, "--load-checkpoint",
                    str(uninterrupted / "checkpoints" / "step-2"), steps=2)
    assert [r["iteration"] for r in read_metrics(resumed)] == [2, 3]
    assert losses(resumed) == pytest.approx(losses(uninterrupted)[2:], rel=LOSS_RTOL)
    assert [r["grad_norm"] for r in read_metrics(resumed)] == pytest.approx(
        [r["grad_norm"] for r in read_metrics(uninterrupted)[2:]], rel=NORM_RTOL)
    return resumed


@pytest.fixture(scope="module")
def deepseek_one_process(tmp_path_factory):
    exp = train(tmp_path_factory.mktemp("dsv3"), "pretrain_deepseek_v3", 1, steps=3)
    return losses(exp), [r["grad_norm"] for r in read_metrics(exp)]


@pytest.fixture(scope="module")
def deepseek_pp2vp2(tmp_path_factory):
    """Tiny DeepSeek-V3 under PP2 VP2 (interleaved) for 4 steps, saving checkpoints at
    steps 2 and 4: a parity run and the source of a resume under one process."""
    return train(tmp_path_factory.mktemp("dsv3pp"), "pretrain_deepseek_v3", 2, "--set", "pp=2",
                 "--set", "vp=2", "--checkpoint-interval", "2", steps=4)


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("layout", ["pp2vp2", "cp2", "ep2", "ep2xtp2", "pp2split"])
def test_deepseek_v3_layouts_train_like_one_process(tmp_path, deepseek_one_process,
                                                    deepseek_pp2vp2, layout):
    """DeepSeek-V3's selection bias moves once per step, by the load of the whole step
    summed over the data and context ranks, so every layout routes as one process does
    (when it moved at every microbatch forward, EP2 was 4.5e-4 off in norm).
    pp2vp2: torch's pipeline stage runs each stage once more on the first step to learn
    its shapes; that extra forward must not count as load (it moved the step-1 norm
    by 1.3e-5 before pp.py kept the MoE state through it). cp2: the sequence-wise
    balance loss's counts are summed over the context ranks (without that, the step-2
    norm moved by 5.4e-5), and MLA's keys and values, of different widths, are gathered
    separately. ep2xtp2: EP over the two TP ranks, each routing its own sequence shard:
    the load and the balance counts are summed over TP too, and MLA runs split by heads.
    pp2split: Megatron's layout language places the 4 layers 1 + 3 (an even split
    would be 2 + 2), as DeepSeek-V3's published rows place their 61."""
    if layout == "pp2vp2":
        exp = deepseek_pp2vp2
    elif layout == "pp2split":
        exp = train(tmp_path, "pretrain_deepseek_v3", 2, "--set", "pp=2 pp_split=Et|tttL",
                    steps=3)
        info = json.loads((exp / "run.json").read_text())
        assert info["parallel"]["stage_layers"] == [[0], [1, 2, 3]]
        assert info["parallel"]["pp_split"] == "Et|tttL"
    elif layout == "ep2xtp2":
        exp = train(tmp_path, "pretrain_deepseek_v3", 2, "--set", "ep=2 tp=2", steps=3)
    else:
        exp = train(tmp_path, "pretrain_deepseek_v3", 2, "--set", layout.replace("2", "=2"),
                    steps=3)
    assert_trains_like_one_process(exp, deepseek_one_process,
                                   PP_NORM_RTOL if layout.startswith("pp") else NORM_RTOL)


@pytest.mark.slow
@pytest.mark.dist
def test_deepseek_v3_pipeline_checkpoint_resumes_in_one_process(tmp_path, deepseek_pp2vp2):
    """The PP2 VP2 run's step-2 checkpoint (each rank wrote its stages' layers, the
    expert biases among them) resumes in one process with the uninterrupted run's
    losses and norms: the bias came back, and no load was left over to lose (when the
    bias moved at every forward, the load carried across steps was not saved and the
    resumed step-2 norm was 2.4e-4 off)."""
    resume_and_compare(tmp_path, "pretrain_deepseek_v3", 1, deepseek_pp2vp2)


@pytest.mark.slow
@pytest.mark.dist
def test_expert_parallel_checkpoint_resumes_under_plain_data_parallelism(tmp_path, ep2):
    """The EP2 run's step-2 checkpoint (each rank wrote half of every expert tensor)
    loads under DP2 without EP (FSDP shards of whole expert tensors) and continues with
    the uninterrupted EP2 run's losses and norms: the weights (step 2) and the optimizer
    state (step 3) came back whole."""
    resumed = resume_and_compare(tmp_path, "pretrain_qwen3", 2, ep2)
    (log,) = resumed.glob("log-*.out")
    assert "saved with TP1 PP1 CP1 DP2 EP2 on 2 ranks, resharded to TP1 PP1 CP1 DP2)" \
        in log.read_text()


# ------------------------------------------- dispatch when a rank receives no rows


def _rows_and_weights(rank: int):
    """The same full expert weights on every rank, and rank `rank`'s 8 rows with their
    gate weights, all routed to experts 0-3 (those of ep rank 0): ep rank 1 receives no
    row at all."""
    gen = torch.Generator().manual_seed(0)
    E, h, f, n = 8, 16, 8, 8
    w1, w3 = torch.randn(E, f, h, generator=gen), torch.randn(E, f, h, generator=gen)
    w2 = torch.randn(E, h, f, generator=gen)
    rows = [torch.randn(n, h, generator=gen) for _ in range(2)]
    weights = [torch.randn(n, h, generator=gen) for _ in range(2)]
    gates = [torch.rand(n, 1, generator=gen) for _ in range(2)]
    counts = torch.tensor([2, 2, 2, 2, 0, 0, 0, 0])
    return (w1, w3, w2), rows[rank], gates[rank], weights[rank], counts


def _input_gradient_worker(rank: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    from trainbench.engine.models.moe import swiglu
    from trainbench.engine.parallel.ep import _ep_compute
    torch.set_num_threads(1)
    # A short timeout: a rank left waiting in an all-to-all fails instead of hanging.
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=30))
    (w1, w3, w2), rows, gates, weight, counts = _rows_and_weights(rank)
    # This rank's half of an MoE layer's experts: their weights and their activation.
    local = SimpleNamespace(activate=swiglu,
                            **{name: w.chunk(2)[rank].clone().requires_grad_()
                               for name, w in zip(("w1", "w3", "w2"), (w1, w3, w2))})
    rows, gates = rows.clone().requires_grad_(), gates.clone().requires_grad_()
    out = _ep_compute(local, dist.group.WORLD, 2)(rows, counts, gates)
    # Gradients to the inputs only, as a pipeline stage's shape inference asks for.
    grads = torch.autograd.grad((out * weight).sum(), (rows, gates))
    torch.save(grads, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()
    leave_spawned_rank()


@pytest.mark.dist
def test_a_rank_that_receives_no_rows_still_returns_its_tokens_gradients(tmp_path):
    """Rank 1's tokens all go to rank 0's experts and rank 1 gets none back to compute.
    Rank 1's output then came only from what rank 0 sent back, and a backward to the
    inputs only skipped both all-to-alls there while rank 0 waited in them: the
    intermittent hang of the EP2 x PP2 run (torch's pipeline stage infers its input
    gradients that way, on uninitialised buffers whose routing is arbitrary)."""
    from trainbench.engine.models.moe import grouped_swiglu
    torch.multiprocessing.spawn(_input_gradient_worker,
                                args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2)
    for rank in range(2):
        (w1, w3, w2), rows, gates, weight, counts = _rows_and_weights(rank)
        rows.requires_grad_(), gates.requires_grad_()
        expected = torch.autograd.grad(
            (grouped_swiglu(rows, counts, w1, w3, w2, weights=gates) * weight).sum(),
            (rows, gates))
        for got, want in zip(torch.load(tmp_path / f"rank{rank}.pt"), expected):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
