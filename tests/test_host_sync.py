"""No host synchronisation inside a training step (issue 19, item 1).

On a GPU, reading a tensor's value on the host (`.item()`, `float(t)`, `bool(t)`, an `if`
on a tensor, `.tolist()`, a copy to the CPU) blocks the CPU until every queued kernel has
run: the GPU then idles while the CPU launches the next kernels. The engine's timed step
(`Trainer.timed_step`: forward, backward, clipping, optimizer step) must do none of it;
loss and grad norm are read once, after the step's timing sync.

There is no GPU here, so the guard counts the reads themselves during a real step of the
engine's own Trainer on the CPU: a TorchFunctionMode sees the Python-level calls (item,
tolist, __bool__, __float__, __int__, numpy, cpu, to("cpu")), and a TorchDispatchMode sees
every aten `_local_scalar_dense`, the one operator through which any scalar read reaches
the data, whichever Python call made it.
"""

from __future__ import annotations

import json
import math
import socket
import traceback
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import leave_spawned_rank, port_outside_the_ephemeral_range
from trainbench.planning import build_plan

HOST_READ_METHODS = {"item", "tolist", "__bool__", "__float__", "__int__", "numpy", "cpu"}


class HostReads:
    """Counts host reads of tensor values inside the `with` block.

    `allowed()` gives the ids of tensors that live on the host by design and may be read:
    torch's non-fused, non-capturable optimizers keep each parameter's step counter on the
    CPU and read it there (no device sync on a GPU); fused AdamW on CUDA keeps it on the
    device and never reads it.
    """

    def __init__(self, allowed=lambda: set()):
        self.reads: list[str] = []
        self.reading_allowed = False
        outer = self

        class _Functions(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                name = getattr(func, "__name__", "")
                target = args[0] if args else None
                to_host = name == "to" and _names_cpu(args[1:], kwargs)
                if name in HOST_READ_METHODS or to_host:
                    if id(target) in allowed():
                        # Its _local_scalar_dense below is this allowed read.
                        outer.reading_allowed = True
                    else:
                        outer.note(f"Tensor.{name}")
                try:
                    return func(*args, **kwargs)
                finally:
                    outer.reading_allowed = False

        class _Dispatch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func is torch.ops.aten._local_scalar_dense.default \
                        and not outer.reading_allowed:
                    outer.note("aten._local_scalar_dense")
                return func(*args, **(kwargs or {}))

        self._modes = (_Functions(), _Dispatch())

    def note(self, what: str) -> None:
        frames = [f for f in traceback.extract_stack()[:-2] if "/torch/overrides" not in f.filename
                  and "_python_dispatch" not in f.filename and "test_host_sync" not in f.filename]
        where = "; ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames[-3:])
        self.reads.append(f"{what} at {where}")

    def __enter__(self) -> "HostReads":
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


def _names_cpu(args, kwargs) -> bool:
    """`.to("cpu")` written out. A move to another tensor's device (`.to(g.device)`, as
    clip_grad does) stays on the GPU there, and on this CPU-only machine it cannot be
    told from a copy to the host, so only an explicit "cpu" counts."""
    device = kwargs.get("device", args[0] if args else None)
    return device == "cpu" or (isinstance(device, str) and device.startswith("cpu:"))


def optimizer_step_counters(optimizer: torch.optim.Optimizer):
    """The ids of the optimizer's step counters, looked up at each read (the first step
    creates them)."""
    return lambda: {id(state["step"]) for state in optimizer.state.values() if "step" in state}


@pytest.fixture
def one_rank(tmp_path, monkeypatch):
    """A factory of real one-rank trainers in this process (gloo, world size 1)."""
    from trainbench.engine.trainer import Trainer
    made = []

    def make(workload: str, dtype: str = "fp32", **overrides) -> Trainer:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)).items():
            monkeypatch.setenv(key, value)
        plan = build_plan(workload, "tiny", dtype, 1, "cpu", steps=3, peak_tflops=1.0,
                          overrides=overrides)
        trainer = Trainer(plan, Path(tmp_path) / f"exp{len(made)}")
        made.append(trainer)
        trainer.setup()
        return trainer

    yield make
    for trainer in made:
        trainer.close()


def _step_reads(trainer, step: int) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    batches = trainer.timed_step_inputs(step)
    with HostReads(optimizer_step_counters(trainer.optimizer)) as reads:
        loss_sum, grad_norm = trainer.timed_step(batches)
    return reads.reads, loss_sum, grad_norm


def test_the_counter_sees_every_kind_of_host_read():
    """The guard can fail: each way of reading a tensor on the host is counted."""
    t = torch.arange(4.0)
    s = t.sum()
    for read in (lambda: s.item(), lambda: float(s), lambda: int(s), lambda: bool(s > 0),
                 lambda: t.tolist(), lambda: t.cpu(), lambda: t.to("cpu"), lambda: t.numpy(),
                 lambda: 1 if s > 0 else 0, lambda: torch.isfinite(s).all().item()):
        with HostReads() as reads:
            read()
        assert reads.reads, read
    with HostReads() as reads:  # tensor arithmetic alone reads nothing
        u = (t * 2).sum() / torch.tensor(3.0)
        torch.nn.utils.clip_grads_with_norm_([torch.nn.Parameter(t.clone())], 1.0, u)
    assert reads.reads == []


@pytest.mark.parametrize("workload", ["pretrain_llama3.1", "pretrain_nemotronh",
                                      "pretrain_deepseek_v3"])
def test_a_training_step_reads_nothing_on_the_host(one_rank, workload):
    """Dense Llama, the hybrid Nemotron-H (Mamba-2 scan, attention, MLP) and the MoE
    DeepSeek-V3 (MLA, router, loss-free bias, shared expert): a real step each, the
    first, in which the optimizer also creates its state.

    The one read MoE may make is the expert loop's: without torch._grouped_mm (a CPU, or
    a GPU before Hopper) the loop needs each expert's row count on the host, once per MoE
    layer per forward; the grouped GEMM takes the counts as device offsets."""
    trainer = one_rank(workload)
    reads, loss_sum, grad_norm = _step_reads(trainer, 0)
    if workload == "pretrain_deepseek_v3":
        loop = [r for r in reads if r.startswith("Tensor.tolist") and "grouped_swiglu" in r]
        assert loop, "the expert loop's count read is gone: tighten this test"
        reads = [r for r in reads if r not in loop]
    assert reads == [], "\n".join(reads)
    # step_metrics, after the timing sync, is where the reads belong: the same counter
    # finds them there, so the empty count above is not the counter missing them.
    with HostReads() as after:
        metrics = trainer.step_metrics(0, 1e-3, loss_sum / trainer.plan.ga, grad_norm, 0.1)
    assert any("__float__" in r for r in after.reads), after.reads
    # The step really trained: the values it returned are finite and positive.
    assert math.isfinite(metrics.loss) and metrics.loss > 0
    assert math.isfinite(metrics.grad_norm) and metrics.grad_norm > 0


@pytest.mark.parametrize("workload", ["pretrain_qwen3", "pretrain_deepseek_v3"])
def test_an_moe_step_on_the_grouped_gemm_path_reads_nothing_on_the_host(one_rank, monkeypatch,
                                                                        workload):
    """The MoE step as a Hopper GPU runs it (issue 35): one bf16 rank keeps fp32 master
    weights under bf16 autocast, and the path selection, told the device is CUDA of
    capability 9.0 with torch._grouped_mm, picks the grouped GEMM for every MoE layer
    (the step's real dtypes decide; here torch's CPU _grouped_mm runs it). Then the
    whole step (router, counts, grouped GEMMs, combine, balance loss, DeepSeek-V3's
    bias load) reads nothing on the host: the loop's split sizes were the MoE's only
    read. tests/test_moe_experts.py checks the same layers operator by operator for
    those that sync a GPU without a read on a CPU (bincount, nonzero, ...)."""
    from trainbench.engine.models import moe as moe_mod
    real, chosen = moe_mod.expert_path, []

    def as_on_hopper(device_type, dtype, **facts):
        path = real("cuda", dtype, **dict(facts, grouped_mm_kernel=True, capability=(9, 0)))
        chosen.append(path)
        return path
    monkeypatch.setattr(moe_mod, "expert_path", as_on_hopper)
    trainer = one_rank(workload, "bf16")
    assert isinstance(trainer.compute_context(), torch.autocast)  # fp32 weights, bf16 GEMMs
    reads, loss_sum, grad_norm = _step_reads(trainer, 0)
    assert chosen and set(chosen) == {"grouped"}, chosen
    assert reads == [], "\n".join(reads)
    assert torch.isfinite(loss_sum) and torch.isfinite(grad_norm)


def test_an_mxfp8_moe_step_reads_nothing_on_the_host(one_rank):
    """MXFP8 experts (torchao's grouped GEMM, emulated on a CPU) with their token groups
    padded by the engine: torchao's own padding, which reads the group sizes on the host
    off Blackwell, is off (float8.mx_config), and the step reads nothing."""
    pytest.importorskip("torchao.prototype.moe_training")
    trainer = one_rank("pretrain_qwen3", "mxfp8")
    reads, loss_sum, _ = _step_reads(trainer, 0)
    assert reads == [], "\n".join(reads)
    assert torch.isfinite(loss_sum)


def test_a_bf16_step_with_recompute_and_a_chunked_loss_reads_nothing_on_the_host(
        one_rank, monkeypatch):
    """Autocast, checkpointed blocks (recomputed inside the backward) and the chunked
    loss (a budget of 64 tokens' logits: 4 checkpointed chunks per microbatch) add no
    read."""
    import trainbench.engine.loss as loss_mod
    monkeypatch.setattr(loss_mod, "CHUNK_ELEMENTS", 64 * 512)
    trainer = one_rank("pretrain_llama3.1", "bf16", recompute="full")
    assert trainer.plan.mbs * trainer.plan.seq_len == 4 * 64
    reads, loss_sum, _ = _step_reads(trainer, 0)
    assert reads == [], "\n".join(reads)
    assert torch.isfinite(loss_sum)


def test_run_json_records_the_kernels(one_rank):
    """The kernels of issue 19 item 3 as run.json records them (tests/test_engine_kernels.py
    checks the kernels themselves)."""
    trainer = one_rank("pretrain_llama3.1")
    info = json.loads((trainer.exp_dir / "run.json").read_text())
    assert info["optimizer"]["name"] == "AdamW"
    assert info["optimizer"]["implementation"] == "foreach"
    assert info["sdpa_backend"] == "flash (CPU, causal)"
    assert info["loss"] == "cross-entropy, fp32 logits (one chunk)"


LAYOUTS = {"PP2": dict(pp=2), "FSDP2": dict(dp=2), "TP2": dict(tp=2), "CP2": dict(cp=2)}


def _layout_ranks(rank: int, ports: list[int], out_dir: str) -> None:
    """One rank (spawned) of each two-rank layout in turn, one process group each: step 0
    untimed (a pipeline's first step infers the stages' activation shapes by exchanging
    metadata), then the host reads of step 1."""
    import os
    torch.set_num_threads(1)
    from trainbench.engine.trainer import Trainer
    for (name, layout), port in zip(LAYOUTS.items(), ports):
        os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        plan = build_plan("pretrain_llama3.1", "tiny", "fp32", 2, "cpu", steps=3,
                          peak_tflops=1.0, overrides=dict(dict(pp=1, tp=1, cp=1, dp=1), **layout))
        trainer = Trainer(plan, Path(out_dir) / name)
        try:
            trainer.setup()
            trainer.timed_step(trainer.timed_step_inputs(0))
            reads, loss_sum, grad_norm = _step_reads(trainer, 1)
            (Path(out_dir) / f"{name}-rank{rank}.json").write_text(json.dumps(
                dict(reads=reads, loss=float(loss_sum), grad_norm=float(grad_norm))))
        finally:
            trainer.close()
    leave_spawned_rank()


@pytest.mark.slow
def test_a_step_of_every_parallel_layout_reads_nothing_on_the_host(tmp_path):
    """PP2 (torch.distributed.pipelining's 1F1B), FSDP2, TP2 (with loss_parallel) and CP2
    (all-gather KV, lower-right causal chunks): two real gloo processes, one after another.

    What torch's pipelining does on its own: the first step exchanges tensor metadata to
    infer the stages' shapes (a host-side exchange, once, before any later step), and on
    gloo each send/recv wait blocks the CPU (on NCCL it only orders streams). Neither is
    a read of a tensor's value, and no later step reads any."""
    import torch.multiprocessing as mp
    ports = [port_outside_the_ephemeral_range() for _ in LAYOUTS]
    mp.spawn(_layout_ranks, args=(ports, str(tmp_path)), nprocs=2, join=True)
    for name in LAYOUTS:
        first, second = (json.loads((tmp_path / f"{name}-rank{r}.json").read_text())
                         for r in (0, 1))
        assert first["reads"] == [] and second["reads"] == [], \
            (name, first["reads"] + second["reads"])
        # Every rank reports the same global norm (shards and stages combined).
        assert first["grad_norm"] == pytest.approx(second["grad_norm"], rel=1e-5), name
        assert first["grad_norm"] > 0
        if name == "PP2":  # only the last stage computes a loss
            assert first["loss"] == 0 and second["loss"] > 0
        else:
            assert first["loss"] > 0 and second["loss"] > 0, name
