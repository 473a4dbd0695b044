"""Published step times of the seed workloads on GPUs and releases the seeds never measured.

These rows are a held-out check of `trainbench predict`: nothing is fitted on them
(bench/predict_accuracy.py predicts them with the constants fitted on the seed cells of
catalog.references, all H100). Pure data, no torch.

Every row is copied from a table NVIDIA published, named in `source` with the table it
sits in. The tables give tokens/s per GPU; the step time is derived from it,
GBS x seq / (tokens/s/GPU x GPUs), which is the definition the tables themselves use
(dgxc-benchmarking llama3.1/README.md: throughput = seq x GBS / step time).

Sources
-------
NEMO_2502_B200
    NeMo Framework user guide, "Performance Summary for Large Language Models", Container
    NeMo 25.02, System DGX-B200, pre-training table (FP8, per-tensor current scaling):
    https://docs.nvidia.com/nemo-framework/user-guide/latest/performance/performance_summary.html
    (the 25.02 version of that page; rows LLAMA3-8B, LLAMA3-70B, LLAMA3-405B,
    Nemotron-15B, Nemotron-340B).
NEMO_2504_GB200
    Same guide, archived 25.04 summary, Container NeMo 25.04, System DGX-GB200,
    pre-training table (FP8):
    https://docs.nvidia.com/nemo-framework/user-guide/latest/performance/archive/25.04-performance-summary.html
NEMO_2507_GB200
    Same guide, Container NeMo 25.07, System DGX-GB200, pre-training table (FP8):
    https://docs.nvidia.com/nemo-framework/user-guide/latest/performance/performance-summary.html
    Its cells print a second figure in parentheses (another configuration of the same
    row); only the first figure and the first layout are used here.
DGXC_2509_GB200_405B
    NVIDIA/dgxc-benchmarking, llama3.1/README.md at commit 07d4a4a (2025-09-24), "MFU
    formula" example: Llama 3.1 405B BF16 on 128 GB200, GBS 64, "training step time =
    9.347" (the MFU line beside it divides by 9.473; the stated step time is used), with the
    GB200 layout table of the same file (128 GPUs: TP4 PP8 CP2 VP8 MBS1 GBS64 GA32).

MB_2511
    NVIDIA-NeMo/Megatron-Bridge, docs/performance-summary.md at commit 5776a6d (2025-12-10),
    "25.11 NeMo Container", pre-training tables for DGX-GB300, DGX-GB200, DGX-B200 and
    DGX-H100; rows LLAMA3_8B, LLAMA3_70B, LLAMA3.1_405B in precision FP8-CS (per-tensor
    current scaling: trainbench's fp8), first figure of each cell.
MB_2509, MB_2602, MB_260201, MB_2604, MB_2606
    Same file at commits fa0315a (2025-10-10, "25.09 NeMo Container"), c0b9a00
    (2026-02-26, "26.02"), cfeddcd (2026-03-21, "26.02.01"), 74695a0 (2026-04-17,
    "26.04") and 8f341b0 (2026-06-22, "26.06"): every dense Llama 3 pre-training row in
    precision FP8 (per-tensor current scaling, as 25.11 names it; the 25.09 tables have no
    precision column and their first figure is that run: the parenthesised one is another
    quantization granularity). MXFP8 and NVFP4 rows are skipped as below; so are 26.06's
    LLAMA3_70B tables at seq 4096 and GBS 32, which are SFT and LoRA, not pre-training.
MB_260401
    Same file at commit 21d102f (2026-05-27), "26.04.01 NeMo Container", per-model
    tables LLAMA3_70B and LLAMA3.1_405B, rows of precision FP8 (MXFP8 and NVFP4 rows
    skipped: the FP8 recipe's layout is not theirs). "FSDP 64" there is FSDP over all 64
    GPUs.
NEMO_2407_H100
    NVIDIA/NeMo, docs/source/performance/performance_summary.md at commit 070a0bb,
    "Pretraining", Container NeMo 24.07, System DGX-H100 (FP8): rows LLAMA3-8B,
    LLAMA3-70B, Nemotron-340B. An earlier release than the seeds, on the seeds' GPU type,
    with other layouts (CP2 for Llama 3). Its LLAMA2-70B row is left out: the table does
    not say whether NeMo recomputed activations, and trainbench's only Llama 2 recipe
    (MaxText's) recomputes fully, so the row's configuration cannot be stated.

MB_2509_MOE / MB_2511_MOE / MB_2602_MOE / MB_260401_MOE
    NVIDIA-NeMo/Megatron-Bridge, docs/performance-summary.md at commits fa0315a (2025-10-10,
    "25.09 NeMo Container"), 5776a6d (2025-12-10, "25.11"), c0b9a00 (2026-02-26, "26.02")
    and 21d102f (2026-05-27, "26.04.01"): the MoE rows DeepSeekV3, Qwen3_30B_a3B and
    Qwen3_235B_a22B. The tables print EP; the recipes behind them
    (scripts/performance/configs/{deepseek,qwen3}/*_llm_pretrain.yaml at fa0315a) set
    ETP=1 and the page says "we force-balance the token distribution among experts and all
    benchmarks are token-dropless" (25.11). The 25.09 table has no precision column; its
    note that parenthesised figures are other FP8 quantization granularities makes the
    first figure the FP8 (per-tensor current scaling) run. FP8-MX / MXFP8 rows are
    trainbench's mxfp8; FP8-CS and FP8 are its fp8. DeepSeek-V3 rows are without MTP
    where the table says so (25.11 GB300/GB200) and unstated otherwise.

Recipe facts beyond the tables: activation offloading
------------------------------------------------------
Some published FSDP rows kept the activations of their first N transformer layers in
host memory (Megatron's `cpu_offloading_num_layers`, NeMo's `activation_offload_layers`).
The tables do not print it; RECIPE_OFFLOAD_LAYERS gives it per row with the recipe file
that sets it: Megatron-Bridge `scripts/performance/configs/llama3/llama3_70b_llm_pretrain.yaml`
and `llama31/llama31_405b_llm_pretrain.yaml` at v0.1.0rc3 (25.09: GB200 70B 40 layers,
405B 95), `configs/llama3/workload_base_configs.py` at v0.2.0 (25.11) and
`configs/llama/llama3_workload_base_configs.py` at v0.3.0, v0.3.1, v0.4.0 and v0.4.1
(26.02, 26.02.01, 26.04, 26.04.01: the 70B FP8-CS configs, GB300 20 layers and GB200
40), and NVIDIA/NeMo `scripts/performance/recommended_model_configs/model_configs_gb200.csv`
at v2.4.0 (NeMo 25.07's 405B GB200 row: 95; its 70B row and v2.3.0's, NeMo 25.04's,
offload none). Every other row offloads nothing in its recipe.

Recipe facts beyond the tables: the loss
----------------------------------------
The runs behind Megatron-Bridge's tables (25.09 on) and NeMo 25.07's compute the loss
with Transformer Engine's fused cross entropy: Megatron-Bridge's Llama 3 8B / 70B and
Llama 3.1 405B model providers set `cross_entropy_fusion_impl = "te"`
(`src/megatron/bridge/models/llama/llama_provider.py` at v0.1.0rc3) and its performance
overrides set it again (`scripts/performance/utils/helpers.py` at v0.2.0,
`utils/overrides.py` from v0.3.1); NeMo's performance helpers set it from v2.4.0
(`scripts/performance/helpers.py`, "enable cross entropy fusion with TE kernel"), not in
v2.3.0 and before. That loss keeps only the BF16 logits for its backward and writes the
gradient into them (`transformer_engine/pytorch/cross_entropy.py`: it saves `_input`, the
target and per-token statistics): 2 bytes per logit, where Megatron's unfused
vocabulary-parallel loss, which predict charges, holds 10.

Recipe facts beyond the tables: the MoE dispatcher
--------------------------------------------------
Most of the MoE rows ran Megatron-Core's flex dispatcher (DeepEP on H100, HybridEP on
GB200 / GB300), which sends a token once to each remote node. The Qwen3 235B-A22B H100
rows ran its alltoall dispatcher, a row per chosen expert: at 25.09 the performance
script applies token drop (`scripts/performance/run_script.py` @fa0315a), and
`apply_moe_token_drop` asserts the alltoall dispatcher, the Qwen3 MoE provider's default
(`src/megatron/bridge/models/qwen/qwen_provider.py` @fa0315a); at 25.11 the H100 FP8-CS
preset names no flex backend (`scripts/performance/configs/qwen/
qwen3_workload_base_configs.py` @5776a6d), so the provider's alltoall stays; at 26.02 and
26.04.01 `qwen3_235b_a22b_pretrain_config_h100` sets `moe_token_dispatcher_type =
"alltoall"` (`configs/qwen/qwen3_llm_pretrain.py` @c0b9a00, @21d102f).
RECIPE_MOE_DISPATCHER gives them; Qwen3 30B-A3B's H100 rows with EP8 keep their experts in
one node, where the two dispatchers move the same bytes.

NeMo's LLAMA3 rows are Llama 3 models; trainbench's pretrain_llama3.1 8B / 70B / 405B have
the same layers, widths and vocabulary (3.1 changed RoPE scaling and the training context,
not the shapes a pretraining step at seq 8192 runs).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

NEMO_2502_B200 = ("NeMo 25.02 Performance Summary, DGX-B200 pre-training table "
                  "(docs.nvidia.com/nemo-framework/user-guide/latest/performance/"
                  "performance_summary.html)")
NEMO_2504_GB200 = ("NeMo 25.04 Performance Summary, DGX-GB200 pre-training table "
                   "(docs.nvidia.com/nemo-framework/user-guide/latest/performance/archive/"
                   "25.04-performance-summary.html)")
NEMO_2507_GB200 = ("NeMo 25.07 Performance Summary, DGX-GB200 pre-training table, first "
                   "figure of each cell (docs.nvidia.com/nemo-framework/user-guide/latest/"
                   "performance/performance-summary.html)")
MB_2511 = ("Megatron-Bridge docs/performance-summary.md @5776a6d, 25.11 NeMo Container "
           "pre-training tables, FP8-CS rows")
MB_260401 = ("Megatron-Bridge docs/performance-summary.md @21d102f, 26.04.01 NeMo Container, "
             "FP8 rows")
MB_2509 = ("Megatron-Bridge docs/performance-summary.md @fa0315a, 25.09 NeMo Container "
           "pre-training tables, first figure of each cell (FP8)")
MB_2602 = ("Megatron-Bridge docs/performance-summary.md @c0b9a00, 26.02 NeMo Container, "
           "FP8 rows")
MB_260201 = ("Megatron-Bridge docs/performance-summary.md @cfeddcd, 26.02.01 NeMo Container, "
             "FP8 rows")
MB_2604 = ("Megatron-Bridge docs/performance-summary.md @74695a0, 26.04 NeMo Container, "
           "FP8 rows")
MB_2606 = ("Megatron-Bridge docs/performance-summary.md @8f341b0, 26.06 NeMo Container, "
           "FP8 rows")
NEMO_2407_H100 = ("NVIDIA/NeMo docs/source/performance/performance_summary.md @070a0bb, NeMo "
                  "24.07 DGX-H100 pre-training table (FP8)")
DGXC_2509_GB200_405B = ("NVIDIA/dgxc-benchmarking llama3.1/README.md @07d4a4a, MFU example "
                        "('training step time = 9.347') and its GB200 layout table")
MB_2509_MOE = ("Megatron-Bridge docs/performance-summary.md @fa0315a, 25.09 NeMo Container, "
               "MoE rows (FP8, first figure)")
MB_2511_MOE = ("Megatron-Bridge docs/performance-summary.md @5776a6d, 25.11 NeMo Container, "
               "MoE rows")
MB_2602_MOE = ("Megatron-Bridge docs/performance-summary.md @c0b9a00, 26.02 NeMo Container, "
               "MoE rows")
MB_260401_MOE = ("Megatron-Bridge docs/performance-summary.md @21d102f, 26.04.01 NeMo "
                 "Container, MoE rows")


@dataclass(frozen=True)
class HeldOutRow:
    workload: str
    size: str
    dtype: str
    gpu_type: str
    gpus: int
    seq_len: int
    tp: int
    pp: int
    cp: int
    vp: int
    mbs: int
    gbs: int
    fsdp: bool
    """The published run sharded with (Megatron) FSDP rather than the distributed optimizer."""
    step_time_s: float
    tokens_per_s_per_gpu: float | None
    """As published (None where the source gives a step time instead)."""
    source: str
    ep: int = 1
    """Expert-parallel size (MoE rows); the published MoE recipes run ETP=1."""
    tflops_per_gpu: float | None = None
    """'Model TFLOP / sec / GPU' as published (MoE rows), for the FLOPs check."""

    @property
    def key(self) -> str:
        return (f"{self.workload} {self.size} {self.dtype} {self.gpus}x{self.gpu_type} "
                f"TP{self.tp} PP{self.pp} CP{self.cp} VP{self.vp}"
                + (f" EP{self.ep}" if self.ep > 1 else "")
                + f" MBS{self.mbs} GBS{self.gbs}" + (" FSDP" if self.fsdp else ""))

    def to_dict(self) -> dict:
        return asdict(self) | {"key": self.key}


def _from_tokens(workload, size, dtype, gpu_type, gpus, seq, tp, pp, cp, vp, mbs, gbs, fsdp,
                 tokens_per_gpu, source) -> HeldOutRow:
    step = gbs * seq / (tokens_per_gpu * gpus)
    return HeldOutRow(workload, size, dtype, gpu_type, gpus, seq, tp, pp, cp, vp, mbs, gbs,
                      fsdp, step, tokens_per_gpu, source)


_L = "pretrain_llama3.1"
_N = "pretrain_nemotron4"

HELD_OUT: list[HeldOutRow] = [
    # gpu type, gpus, seq, TP, PP, CP, VP, MBS, GBS, FSDP, tokens/s/GPU
    _from_tokens(_L, "8b", "fp8", "b200", 8, 8192, 1, 1, 1, 1, 2, 128, False, 26006,
                 NEMO_2502_B200),
    _from_tokens(_L, "70b", "fp8", "b200", 64, 8192, 2, 4, 2, 5, 1, 128, False, 3062,
                 NEMO_2502_B200),
    _from_tokens(_L, "405b", "fp8", "b200", 128, 8192, 4, 8, 2, 8, 1, 64, False, 625,
                 NEMO_2502_B200),
    _from_tokens(_N, "15b", "fp8", "b200", 64, 4096, 1, 1, 1, 1, 2, 256, False, 14760,
                 NEMO_2502_B200),
    _from_tokens(_N, "340b", "fp8", "b200", 128, 4096, 8, 4, 1, 12, 1, 32, False, 602,
                 NEMO_2502_B200),
    _from_tokens(_L, "8b", "fp8", "gb200", 8, 8192, 1, 1, 1, 1, 2, 128, False, 33099,
                 NEMO_2504_GB200),
    _from_tokens(_L, "70b", "fp8", "gb200", 64, 8192, 1, 1, 1, 1, 1, 128, True, 4035,
                 NEMO_2504_GB200),
    _from_tokens(_L, "405b", "fp8", "gb200", 128, 8192, 4, 8, 2, 8, 1, 64, False, 665,
                 NEMO_2504_GB200),
    _from_tokens(_N, "15b", "fp8", "gb200", 64, 4096, 1, 1, 1, 1, 2, 256, False, 17809,
                 NEMO_2504_GB200),
    _from_tokens(_N, "340b", "fp8", "gb200", 128, 4096, 8, 4, 1, 12, 1, 32, False, 737,
                 NEMO_2504_GB200),
    _from_tokens(_L, "8b", "fp8", "gb200", 8, 8192, 1, 1, 1, 1, 2, 128, False, 31737,
                 NEMO_2507_GB200),
    _from_tokens(_L, "70b", "fp8", "gb200", 64, 8192, 1, 1, 1, 1, 1, 128, True, 4066,
                 NEMO_2507_GB200),
    _from_tokens(_L, "405b", "fp8", "gb200", 128, 8192, 2, 1, 1, 1, 1, 64, True, 706,
                 NEMO_2507_GB200),
    HeldOutRow(_L, "405b", "bf16", "gb200", 128, 8192, 4, 8, 2, 8, 1, 64, False, 9.347, None,
               DGXC_2509_GB200_405B),
    # Megatron-Bridge 25.09
    _from_tokens(_L, "8b", "fp8", "gb200", 8, 8192, 1, 1, 1, 1, 2, 128, False, 31357, MB_2509),
    _from_tokens(_L, "70b", "fp8", "gb200", 64, 8192, 1, 1, 1, 1, 2, 128, True, 3986, MB_2509),
    _from_tokens(_L, "405b", "fp8", "gb200", 128, 8192, 2, 1, 1, 1, 1, 64, True, 729, MB_2509),
    _from_tokens(_L, "8b", "fp8", "b200", 8, 8192, 1, 1, 1, 1, 2, 128, False, 29994, MB_2509),
    _from_tokens(_L, "405b", "fp8", "b200", 128, 8192, 4, 8, 2, 8, 1, 64, False, 664, MB_2509),
    _from_tokens(_L, "8b", "fp8", "h100", 8, 8192, 1, 1, 1, 1, 1, 128, True, 14079, MB_2509),
    _from_tokens(_L, "70b", "fp8", "h100", 64, 8192, 4, 8, 1, 5, 1, 128, False, 1619, MB_2509),
    _from_tokens(_L, "405b", "fp8", "h100", 1024, 8192, 8, 8, 2, 8, 1, 512, False, 302,
                 MB_2509),
    # Megatron-Bridge 25.11
    _from_tokens(_L, "8b", "fp8", "gb300", 8, 8192, 1, 1, 1, 1, 2, 128, False, 37556, MB_2511),
    _from_tokens(_L, "70b", "fp8", "gb300", 64, 8192, 1, 1, 1, 1, 2, 256, True, 4520, MB_2511),
    _from_tokens(_L, "405b", "fp8", "gb300", 256, 8192, 2, 8, 2, 4, 1, 1536, False, 999,
                 MB_2511),
    _from_tokens(_L, "8b", "fp8", "gb200", 8, 8192, 1, 1, 1, 1, 2, 128, False, 31508, MB_2511),
    _from_tokens(_L, "70b", "fp8", "gb200", 64, 8192, 1, 1, 1, 1, 2, 256, True, 4312, MB_2511),
    _from_tokens(_L, "405b", "fp8", "gb200", 256, 8192, 4, 16, 1, 4, 1, 1536, False, 813,
                 MB_2511),
    _from_tokens(_L, "8b", "fp8", "b200", 8, 8192, 1, 1, 1, 1, 2, 128, False, 30624, MB_2511),
    _from_tokens(_L, "405b", "fp8", "b200", 128, 8192, 4, 8, 2, 8, 1, 64, False, 661, MB_2511),
    _from_tokens(_L, "8b", "fp8", "h100", 8, 8192, 1, 1, 1, 1, 1, 128, True, 14451, MB_2511),
    _from_tokens(_L, "70b", "fp8", "h100", 64, 8192, 4, 8, 1, 5, 1, 128, False, 1602, MB_2511),
    _from_tokens(_L, "405b", "fp8", "h100", 1024, 8192, 8, 8, 2, 8, 1, 512, False, 292,
                 MB_2511),
    # Megatron-Bridge 26.02
    _from_tokens(_L, "70b", "fp8", "gb300", 64, 8192, 1, 1, 1, 1, 2, 256, True, 5003, MB_2602),
    _from_tokens(_L, "405b", "fp8", "gb300", 256, 8192, 4, 8, 1, 4, 1, 1536, False, 988,
                 MB_2602),
    _from_tokens(_L, "70b", "fp8", "gb200", 64, 8192, 1, 1, 1, 1, 2, 256, True, 4040, MB_2602),
    _from_tokens(_L, "405b", "fp8", "gb200", 256, 8192, 4, 16, 1, 4, 1, 1536, False, 793,
                 MB_2602),
    _from_tokens(_L, "70b", "fp8", "h100", 64, 8192, 4, 8, 1, 5, 1, 256, False, 1621, MB_2602),
    _from_tokens(_L, "405b", "fp8", "h100", 1024, 8192, 8, 8, 2, 8, 1, 1536, False, 311,
                 MB_2602),
    # Megatron-Bridge 26.02.01
    _from_tokens(_L, "70b", "fp8", "gb300", 64, 8192, 1, 1, 1, 1, 2, 256, True, 5243,
                 MB_260201),
    _from_tokens(_L, "405b", "fp8", "gb300", 256, 8192, 2, 8, 2, 4, 1, 1536, False, 1024,
                 MB_260201),
    _from_tokens(_L, "70b", "fp8", "gb200", 64, 8192, 1, 1, 1, 1, 2, 256, True, 4357,
                 MB_260201),
    _from_tokens(_L, "405b", "fp8", "gb200", 256, 8192, 4, 16, 1, 4, 1, 1536, False, 818,
                 MB_260201),
    _from_tokens(_L, "70b", "fp8", "h100", 64, 8192, 4, 8, 1, 5, 1, 256, False, 1639,
                 MB_260201),
    # Megatron-Bridge 26.04
    _from_tokens(_L, "70b", "fp8", "gb300", 64, 8192, 1, 1, 1, 1, 2, 256, True, 5243, MB_2604),
    _from_tokens(_L, "405b", "fp8", "gb300", 256, 8192, 4, 8, 1, 4, 1, 1536, False, 1036,
                 MB_2604),
    _from_tokens(_L, "70b", "fp8", "gb200", 64, 8192, 1, 1, 1, 1, 2, 256, True, 4143, MB_2604),
    _from_tokens(_L, "405b", "fp8", "gb200", 256, 8192, 4, 16, 1, 4, 1, 1536, False, 842,
                 MB_2604),
    _from_tokens(_L, "70b", "fp8", "h100", 64, 8192, 4, 8, 1, 5, 1, 256, False, 1633, MB_2604),
    # Megatron-Bridge 26.04.01
    _from_tokens(_L, "70b", "fp8", "gb300", 64, 8192, 1, 1, 1, 1, 2, 256, True, 5248,
                 MB_260401),
    _from_tokens(_L, "70b", "fp8", "gb200", 64, 8192, 1, 1, 1, 1, 2, 256, True, 4224,
                 MB_260401),
    _from_tokens(_L, "70b", "fp8", "h100", 64, 8192, 4, 8, 1, 5, 1, 256, False, 1664,
                 MB_260401),
    _from_tokens(_L, "405b", "fp8", "gb300", 256, 8192, 4, 8, 1, 4, 1, 1536, False, 1024,
                 MB_260401),
    _from_tokens(_L, "405b", "fp8", "gb200", 256, 8192, 4, 16, 1, 4, 1, 1536, False, 864,
                 MB_260401),
    _from_tokens(_L, "405b", "fp8", "h100", 1024, 8192, 8, 8, 2, 8, 1, 1536, False, 328,
                 MB_260401),
    # Megatron-Bridge 26.06
    _from_tokens(_L, "405b", "fp8", "gb300", 256, 8192, 4, 8, 1, 4, 1, 1536, False, 1048,
                 MB_2606),
    _from_tokens(_L, "405b", "fp8", "gb200", 256, 8192, 4, 16, 1, 4, 1, 1536, False, 843,
                 MB_2606),
    _from_tokens(_L, "405b", "fp8", "h100", 1024, 8192, 8, 8, 2, 8, 1, 1536, False, 326,
                 MB_2606),
    # NeMo 24.07, H100
    _from_tokens(_L, "8b", "fp8", "h100", 8, 8192, 1, 1, 2, 1, 1, 128, False, 12036,
                 NEMO_2407_H100),
    _from_tokens(_L, "70b", "fp8", "h100", 64, 8192, 4, 4, 2, 5, 1, 128, False, 1533,
                 NEMO_2407_H100),
    _from_tokens(_N, "340b", "fp8", "h100", 128, 4096, 8, 8, 1, 12, 1, 32, False, 322,
                 NEMO_2407_H100),
]


def _moe(workload, size, dtype, gpu_type, gpus, tp, pp, vp, ep, mbs, gbs, tokens_per_gpu,
         tflops, source) -> HeldOutRow:
    row = _from_tokens(workload, size, dtype, gpu_type, gpus, 4096, tp, pp, 1, vp, mbs, gbs,
                       False, tokens_per_gpu, source)
    return replace(row, ep=ep, tflops_per_gpu=tflops)


_Q = "pretrain_qwen3"
_D = "pretrain_deepseek_v3"

# The published MoE rows: all seq 4096, CP 1, no FSDP, ETP 1; VP "n/a" -> 1.
# Held out like the rest: predict is never fitted on them.
HELD_OUT_MOE: list[HeldOutRow] = [
    # workload, size, dtype, gpu, gpus, TP, PP, VP, EP, MBS, GBS, tokens/s/GPU, TFLOPS/GPU
    # H100
    _moe(_D, "671b", "fp8", "h100", 1024, 2, 8, 4, 64, 1, 8192, 1297, 338, MB_2509_MOE),
    _moe(_Q, "30b_a3b", "fp8", "h100", 16, 1, 2, 24, 8, 2, 512, 10494, 241, MB_2509_MOE),
    _moe(_Q, "235b_a22b", "fp8", "h100", 256, 2, 8, 4, 32, 1, 2048, 1204, 178, MB_2509_MOE),
    _moe(_Q, "30b_a3b", "fp8", "h100", 16, 1, 2, 24, 8, 2, 512, 5275, 121, MB_2511_MOE),
    _moe(_Q, "235b_a22b", "fp8", "h100", 256, 2, 8, 4, 32, 1, 2048, 1575, 233, MB_2511_MOE),
    _moe(_Q, "30b_a3b", "fp8", "h100", 16, 1, 2, 12, 8, 1, 1024, 5113, 118, MB_2602_MOE),
    _moe(_Q, "235b_a22b", "fp8", "h100", 256, 2, 8, 4, 32, 1, 8192, 1633, 242, MB_2602_MOE),
    _moe(_Q, "30b_a3b", "fp8", "h100", 16, 1, 1, 1, 16, 1, 1024, 8960, 206, MB_260401_MOE),
    _moe(_Q, "235b_a22b", "fp8", "h100", 256, 2, 8, 4, 32, 1, 8192, 1712, 253, MB_260401_MOE),
    # BF16 on Blackwell (25.11; DeepSeek-V3 without MTP)
    _moe(_D, "671b", "bf16", "gb300", 256, 1, 2, 4, 32, 1, 4096, 3848, 961, MB_2511_MOE),
    _moe(_D, "671b", "bf16", "gb200", 256, 1, 4, 4, 64, 1, 4096, 3139, 782, MB_2511_MOE),
    _moe(_Q, "235b_a22b", "bf16", "gb300", 256, 1, 4, 12, 16, 2, 8192, 6131, 907, MB_2511_MOE),
    _moe(_Q, "235b_a22b", "bf16", "gb200", 256, 1, 8, 3, 32, 1, 8192, 4916, 728, MB_2511_MOE),
    # MXFP8 on Blackwell (26.04.01)
    _moe(_D, "671b", "mxfp8", "gb200", 256, 1, 4, 4, 64, 1, 4096, 4256, 1106, MB_260401_MOE),
    _moe(_D, "671b", "mxfp8", "b200", 256, 1, 8, 2, 32, 1, 4096, 3328, 864, MB_260401_MOE),
    _moe(_Q, "30b_a3b", "mxfp8", "gb200", 8, 1, 1, 1, 8, 4, 512, 26112, 599, MB_260401_MOE),
    _moe(_Q, "30b_a3b", "mxfp8", "b200", 8, 1, 1, 1, 8, 4, 512, 27136, 619, MB_260401_MOE),
    _moe(_Q, "235b_a22b", "mxfp8", "gb200", 256, 1, 8, 3, 32, 1, 8192, 5680, 840,
         MB_260401_MOE),
]


# (table, GPU type, size) of the FSDP rows whose recipe offloads activations: how many
# transformer layers' activations live in host memory (see "Recipe facts" above).
_MB_70B_OFFLOAD = {(src, "gb300", "70b"): 20 for src in (MB_2511, MB_2602, MB_260201, MB_2604,
                                                         MB_260401)}
_MB_70B_OFFLOAD.update({(src, "gb200", "70b"): 40 for src in (MB_2509, MB_2511, MB_2602,
                                                              MB_260201, MB_2604, MB_260401)})
RECIPE_OFFLOAD_LAYERS: dict[tuple[str, str, str], int] = {
    **_MB_70B_OFFLOAD,
    (MB_2509, "gb200", "405b"): 95,
    (NEMO_2507_GB200, "gb200", "405b"): 95,
}


def offload_layers(row: HeldOutRow) -> int:
    """Transformer layers whose activations the row's recipe kept in host memory."""
    if not row.fsdp:
        return 0
    return RECIPE_OFFLOAD_LAYERS.get((row.source, row.gpu_type, row.size), 0)


# The tables whose runs used Transformer Engine's fused cross entropy (see "the loss").
TE_CROSS_ENTROPY_SOURCES = frozenset({MB_2509, MB_2511, MB_2602, MB_260201, MB_2604, MB_260401,
                                      MB_2606, NEMO_2507_GB200})


RECIPE_MOE_DISPATCHER: dict[tuple[str, str, str], str] = {
    (src, "h100", "235b_a22b"): "alltoall"
    for src in (MB_2509_MOE, MB_2511_MOE, MB_2602_MOE, MB_260401_MOE)
}
"""(table, GPU type, size) -> the MoE rows' dispatcher where it is not the flex one (see
"Recipe facts" above)."""


def moe_dispatcher(row: HeldOutRow) -> str:
    """The dispatcher the row's run sent its MoE tokens with: 'flex' or 'alltoall'."""
    return RECIPE_MOE_DISPATCHER.get((row.source, row.gpu_type, row.size), "flex")


def te_cross_entropy(row: HeldOutRow) -> bool:
    """Whether the row's run computed the loss with TE's fused cross entropy."""
    return row.source in TE_CROSS_ENTROPY_SOURCES
