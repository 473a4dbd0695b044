"""What the acceptance run runs: one row per family and dtype, plus a checkpoint
save-and-resume, a profiled step and a probe. Pure data and selection, no torch.

On a GPU each family runs its real-width proxy: the published model's width cut to the
depth (and, for the MoE models, the experts) that one 80 GB GPU holds, checked with
predict before it launches. A proxy that does not plan or is predicted not to fit runs
the family's tiny size instead, and the report says why. On a CPU every family runs its
tiny size.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog import hardware

SINGLE_RANK = "tp=1 pp=1 cp=1 dp=1"
"""Every acceptance row runs on one GPU (or one CPU process)."""
TINY_CPU = "gbs=2"
"""The tiny sizes' recipe rows accumulate 4 microbatches of 2; one is enough to check a
family trains, and FP8 GEMMs in software make each microbatch costly on a CPU."""


@dataclass(frozen=True)
class Family:
    key: str
    workload: str
    size: str
    """The published size whose width the GPU proxy keeps."""
    settings: str
    """--set for the one-GPU proxy (besides SINGLE_RANK): depth, experts, batch."""
    moe: bool = False


# Depths chosen with `trainbench predict --gpu h100 --scale 1` (engine sharding) to leave
# room on one H100 (78.8 GiB usable) in bf16 and fp8: Llama 3.1 8B 4 layers 44 GiB, Llama 2
# 70B 2 layers 44 GiB, Nemotron-4 15B 2 layers 75 GiB (its 256k vocabulary's embedding
# and head are 3.1B parameters), Nemotron-H 56B 3 layers (one Mamba-2, one MLP, one
# attention: "M-*") 66 GiB, Qwen3 30B-A3B 2 layers with all 128 experts 37 GiB. DeepSeek-V3
# needs fewer experts than its 256 (4 layers with all of them: 266 GiB).
FAMILIES = (
    Family("llama3.1", "pretrain_llama3.1", "8b", "layers=4 mbs=1 gbs=2"),
    Family("llama2", "pretrain_llama2", "70b", "layers=2 mbs=1 gbs=2"),
    Family("nemotron4", "pretrain_nemotron4", "15b", "layers=2 mbs=1 gbs=2"),
    Family("nemotronh", "pretrain_nemotronh", "56b", "layers=3 mbs=1 gbs=2"),
    Family("qwen3", "pretrain_qwen3", "30b_a3b", "layers=2 mbs=1 gbs=2 ep=1 vp=1", moe=True),
    Family("deepseek_v3", "pretrain_deepseek_v3", "671b",
           "layers=4 experts=8 mbs=1 gbs=2 ep=1 vp=1", moe=True),
)

LOW = "low"
"""In QUICK: the family's FP8 dtype on this machine (low_precision)."""
QUICK = (("llama3.1", "bf16"), ("llama3.1", LOW), ("nemotronh", LOW), ("deepseek_v3", "bf16"))
"""The quick subset's training rows: the dense path in both precisions, the hybrid in its
seed's (FP8), an MoE with MLA in bf16; the checkpoint, profile and probe rows run too."""

TRAIN, BUILD, CHECKPOINT, PROFILE, PROBE = "train", "build", "checkpoint", "profile", "probe"


@dataclass(frozen=True)
class Row:
    label: str
    """What the table and --only / --time-limit call it, e.g. 'llama3.1-fp8'."""
    kind: str
    """TRAIN, BUILD (`check` of the real-width proxy), CHECKPOINT (save, then resume),
    PROFILE or PROBE."""
    workload: str = ""
    size: str = ""
    dtype: str = ""
    settings: str = ""
    limit_s: float = 0.0
    note: str = ""
    """Why the row runs what it runs (a fallback to the tiny size)."""

    @property
    def shape(self) -> str:
        """The model as the table names it: size and the --set that shapes it (and, where
        the label does not say them, the family and dtype)."""
        shown = " ".join(p for p in self.settings.split() if p not in SINGLE_RANK.split())
        if self.kind not in (TRAIN, BUILD):  # the label names neither
            shown = f"{self.workload.removeprefix('pretrain_')} {self.size} {self.dtype} {shown}"
            return shown.strip()
        return f"{self.size} {shown}".strip()


def low_precision(gpu: hardware.GPU | None, moe: bool) -> str | None:
    """The FP8 dtype a family runs here: MXFP8 on Blackwell; FP8 on other GPUs with FP8
    tensor cores; on a CPU fp8's emulation, but MXFP8's for an MoE (torchao's FP8 grouped
    GEMM needs CUDA). None where the GPU has no FP8."""
    if gpu is None:
        return "mxfp8" if moe else "fp8"
    if gpu.peak("mxfp8"):
        return "mxfp8"
    return "fp8" if gpu.peak("fp8") else None


def matches(label: str, keys: tuple[str, ...]) -> bool:
    """--only and --time-limit name rows by any part of their label."""
    return any(k in label for k in keys)


def training_rows(gpu: hardware.GPU | None, has_torchao: bool, quick: bool
                  ) -> tuple[list[Row], list[str]]:
    """Each family in bf16 and in its FP8 dtype (the quick subset: QUICK), as the catalog
    names them (the GPU proxy, or the tiny size on a CPU), and what was skipped and why."""
    rows, skipped = [], []
    for fam in FAMILIES:
        low = low_precision(gpu, fam.moe)
        for dtype in ("bf16", LOW):
            if quick and (fam.key, dtype) not in QUICK:
                continue
            if dtype == LOW:
                if not has_torchao:
                    skipped.append(f"{fam.key} fp8: no torchao: fp8 rows skipped (pip install "
                                   "torchao, or carry its wheel: docs/gpu-acceptance.md)")
                    continue
                if low is None:
                    skipped.append(f"{fam.key} fp8: {gpu.name} has no FP8 tensor cores")
                    continue
                dtype = low
            if gpu is None:
                rows.append(Row(f"{fam.key}-{dtype}", TRAIN, fam.workload, "tiny", dtype,
                                f"{SINGLE_RANK} {TINY_CPU}"))
            else:
                rows.append(Row(f"{fam.key}-{dtype}", TRAIN, fam.workload, fam.size, dtype,
                                f"{fam.settings} {SINGLE_RANK}"))
    return rows, skipped


def build_rows(quick: bool) -> list[Row]:
    """Each family's real-width GPU proxy built with `trainbench check` (the meta device,
    a fake process group: no GPU needed), so a CPU run, whose training rows are the tiny
    sizes, exercises those shapes too."""
    keys = {key for key, _ in QUICK} if quick else {f.key for f in FAMILIES}
    return [Row(f"{f.key}-build", BUILD, f.workload, f.size, "bf16",
                f"{f.settings} {SINGLE_RANK}") for f in FAMILIES if f.key in keys]


def check_rows(gpu: hardware.GPU | None) -> list[Row]:
    """The checkpoint save-and-resume (the tiny Llama 3.1 everywhere: a real-width
    checkpoint is tens of GB of disk and minutes of writing), one profiled step of the
    Llama 3.1 proxy, and a probe of this device. On a CPU the first two run in fp32, its
    fastest dtype (bf16 steps took 8x as long on a 2-core Xeon with native bf16): what
    they check does not depend on the dtype."""
    tiny = f"{SINGLE_RANK} {TINY_CPU}"
    llama = FAMILIES[0]
    dtype = "fp32" if gpu is None else "bf16"
    profiled = (Row("profile", PROFILE, llama.workload, "tiny", dtype, tiny) if gpu is None
                else Row("profile", PROFILE, llama.workload, llama.size, dtype,
                         f"{llama.settings} {SINGLE_RANK}"))
    return [Row("checkpoint", CHECKPOINT, llama.workload, "tiny", dtype, tiny), profiled,
            Row("probe", PROBE)]
