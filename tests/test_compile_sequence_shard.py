"""Compiled blocks under tensor parallelism keep the sequence shard, not the whole
sequence, for the backward (engine/parallel/tp.py, recomputed_in_backward).

Eager, the engine's sequence-parallel gather keeps only the shard through saved-tensor
hooks, which torch.compile cannot trace: a compiled block broke there and ran partly
eager. Compiled, the gather is marked for recomputation instead, and AOTAutograd's
partitioner gathers again in the backward. Counted here on two real gloo ranks: every
tensor a compiled block saves for its backward, by shape. Whole-sequence activations
([microbatch, sequence, hidden]) are what keeping the shard must leave out; with the
shard-keeping switched off the same blocks save at least one per gathered input (the
attention's and the MLP's).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import leave_spawned_rank, port_outside_the_ephemeral_range

torch = pytest.importorskip("torch")


def _saved_by_blocks(trainer) -> tuple[int, int]:
    """(whole-sequence tensors, all tensors) the blocks save in one forward on this rank."""
    from torch.autograd.graph import saved_tensors_hooks
    plan = trainer.plan
    whole = plan.mbs * plan.seq_len * plan.model.hidden
    counts = {"whole": 0, "all": 0}

    def pack(t):
        local = t.to_local() if hasattr(t, "to_local") else t
        counts["all"] += 1
        if local.numel() == whole and local.shape[-1] == plan.model.hidden:
            counts["whole"] += 1
        return t

    hooks = saved_tensors_hooks(pack, lambda t: t)
    for block in trainer.model.layers.values():
        block.register_forward_pre_hook(lambda *_: hooks.__enter__())
        block.register_forward_hook(lambda *_: hooks.__exit__(None, None, None))
    inputs, _ = next(trainer.context_shard(i, t) for i, t in trainer.step_batches(1))
    with trainer.loss_context(), trainer.compute_context():
        trainer.model(inputs, trainer.positions())
    return counts["whole"], counts["all"]


def _rank(rank: int, ports: list[int], out_dir: str) -> None:
    import os
    torch.set_num_threads(1)
    from trainbench.engine.parallel import tp
    from trainbench.engine.trainer import Trainer
    from trainbench.planning import build_plan
    keeping = tp._gather_input
    for keep, port in zip((True, False), ports):
        os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        tp._gather_input = keeping if keep else (lambda keep_shard=True: keeping(False))
        plan = build_plan("pretrain_llama3.1", "tiny", "fp32", 2, "cpu", steps=2,
                          peak_tflops=1.0, overrides=dict(tp=2, compile=True))
        trainer = Trainer(plan, Path(out_dir) / f"keep-{keep}")
        try:
            trainer.setup()
            trainer.timed_step(trainer.timed_step_inputs(0))  # compiles
            whole, saved = _saved_by_blocks(trainer)
            (Path(out_dir) / f"keep-{keep}-rank{rank}.json").write_text(json.dumps(
                dict(whole=whole, saved=saved, blocks=len(trainer.model.layers))))
        finally:
            trainer.close()
    leave_spawned_rank()


@pytest.mark.slow
@pytest.mark.dist
def test_compiled_tensor_parallel_blocks_keep_the_shard_not_the_whole_sequence(tmp_path):
    import torch.multiprocessing as mp
    ports = [port_outside_the_ephemeral_range() for _ in range(2)]
    mp.spawn(_rank, args=(ports, str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        kept, whole = (json.loads((tmp_path / f"keep-{k}-rank{rank}.json").read_text())
                       for k in (True, False))
        assert kept["whole"] == 0, kept
        assert whole["whole"] >= 2 * whole["blocks"], whole
