"""What trainbench adds to every rank's environment, whichever executor starts the ranks
(torchrun here, or the sbatch script's srun)."""

from __future__ import annotations

from collections.abc import Mapping

from ..conditions import ALLOCATOR_VARS

# A user's setting of either allocator variable wins over this default. The newer name:
# torch 2.11 and later read it (2.9.1 ignored it for CUDA, pytorch/pytorch#183387) and
# warn that the older one is deprecated.
ALLOCATOR_DEFAULT = ("PYTORCH_ALLOC_CONF", "expandable_segments:True")
NCCL_TRACE = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "COLL,P2P,NET"}


def rank_additions(plan, inherited: Mapping[str, str]) -> dict[str, str]:
    """The variables trainbench sets for the ranks last, given what they inherit (this
    shell's environment, the cluster config's and the plan's --env): the allocator's
    setting only where the user left it unset, PYTHONUNBUFFERED always."""
    added = {}
    if plan.device == "cuda" and not any(name in inherited for name in ALLOCATOR_VARS):
        # Expandable segments let the caching allocator grow one mapping instead of
        # caching fixed-size blocks, so the step's tensors of many sizes (activations,
        # logits, FP8 copies) do not strand reserved memory the peak then has to fit
        # beside. torchtitan's launcher sets it; Megatron-Bridge's performance guide
        # names it as the fix for "segmentation penalties".
        added[ALLOCATOR_DEFAULT[0]] = ALLOCATOR_DEFAULT[1]
    added["PYTHONUNBUFFERED"] = "1"  # rank output reaches the log as it happens
    return added
