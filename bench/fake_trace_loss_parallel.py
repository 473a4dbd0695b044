"""What torch's memory tracker counts for a vocabulary-parallel loss, on real tensors and
under FakeTensorMode (how `trainbench check --trace` runs a rank).

One rank of eight (a fake process group) holds 1/8 of [1024 tokens, 1024 words] of
logits; the loss runs under `loss_parallel`, as the engine's does under TP. On real
tensors the tracker sees the rank's shards; under FakeTensorMode it also counts
whole-vocabulary tensors, which the rank never holds (the tensors it keeps are 1/8 wide
in both modes: printed below). They are DTensor's output-shape propagation, which runs
each op on whole-tensor stand-ins inside the active fake mode; `check --trace` gives that
propagation a fake mode of its own (check/build.py, `_dtensor_propagation_untracked`),
and the third line shows the tracker then counts what real tensors hold.

    .venv/bin/python bench/fake_trace_loss_parallel.py
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import loss_parallel
from torch.testing._internal.distributed.fake_pg import FakeStore

TOKENS, VOCAB, TP = 1024, 1024, 8
MIB = 2 ** 20


def traced_mib(mesh, fake: bool) -> tuple[float, tuple[int, ...]]:
    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    with mode:
        shard = torch.randn(TOKENS, VOCAB // TP, dtype=torch.bfloat16)
        logits = DTensor.from_local(shard, mesh, [Shard(1)]).requires_grad_()
        labels = torch.randint(0, VOCAB, (TOKENS,))
        tracker = MemTracker()
        with tracker, loss_parallel():
            upcast = logits.float()
            F.cross_entropy(upcast, labels)
            (peak,) = tracker.get_tracker_snapshot("peak").values()
        return peak["Total"] / MIB, tuple(upcast.to_local().shape)


def main() -> None:
    dist.init_process_group("fake", rank=0, world_size=TP, store=FakeStore())
    try:
        shard_mib = TOKENS * VOCAB // TP * 4 / MIB
        print(f"one rank of TP{TP}: fp32 logits shard {shard_mib:.2f} MiB, "
              f"whole vocabulary {shard_mib * TP:.2f} MiB")
        mesh = init_device_mesh("cpu", (TP,))
        from trainbench.check.build import _dtensor_propagation_untracked
        runs = (("real tensors", False, contextlib.nullcontext),
                ("FakeTensorMode", True, contextlib.nullcontext),
                ("FakeTensorMode, check's propagation stand-in", True,
                 _dtensor_propagation_untracked))
        for label, fake, standin in runs:
            with standin():
                mib, local = traced_mib(mesh, fake)
            print(f"{label:>45}: tracker peak {mib:6.2f} MiB; the rank's fp32 logits are "
                  f"{local}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
