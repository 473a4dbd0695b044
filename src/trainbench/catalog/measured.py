"""Public MEASURED sustained figures per GPU type, each with its source, or None with the
reason none is stored. Pure data, no torch.

catalog.hardware holds spec-sheet peaks; this module holds what a GPU or its interconnect
was measured to sustain. `trainbench predict` uses a figure from here for a GPU type the
seeds never measured (predict/device.py), and says which figure came from where. A
figure is never a constant fitted to one workload: where no measurement could be cited,
the entry is None and its `reason` says what was looked for, so the predictor keeps its
catalog assumption and labels it an assumption. A hardware profile from `trainbench
probe` (predict --hardware) replaces all of these with the user's own measurements.

Sources
-------
MAMF
    stas00/ml-engineering, compute/accelerator/README.md (commit 744d01e, 2026-08-22),
    "Maximum Achievable Matmul FLOPS comparison table": the best mean TFLOPS of torch
    `matmul` over a brute-force search of large shapes (mamf-finder.py), BF16 and FP8
    (float8_e4m3fn) tables. Rows used: H100 SXM 794.5 / 1402.6 ("H200 is the same" for
    BF16), H200 SXM FP8 1453.4, B200 SXM 1745.0 / 3432.5, B300 SXM 1769.0 / 3353.3,
    GB200 1822.0 / 3615.6, MI300X BF16 668.4 (its FP8 row is empty). No GB300 row.
NCCL_H100
    NVIDIA/dgxc-benchmarking, nccl/README.md (HEAD 841f546), "View sample output
    (AllReduce excerpt)": nccl-tests all_reduce_perf on 8 x H100 80GB HBM3 in one node,
    float sum, out-of-place busbw 361.67 GB/s at 64 MiB, 400.53 at 128 MiB, 466.33 at
    1 GiB, 480.16 at 8 GiB; 13-17 us from 8 B to 2 KiB.
CUDNN_SDPA
    NVIDIA/cudnn-frontend, benchmark/sdpa_benchmark_training (the cuDNN team's attention
    benchmark for training): causal BF16 scaled-dot-product attention at Llama 3.1's
    shape (8 K/V heads of 128, GQA), sequence 8192, forward and backward timed apart.
    The figure stored is the fwd + bwd rate, (fwd FLOPs + bwd FLOPs) / (fwd ms + bwd ms),
    from each CSV row's times and TFLOPS (both count causal FLOPs). predict divides one
    GPU's rate by Hopper's, so the rows used are one software release and one batch, the
    runs of cuDNN 9.19 at batch 1 and 64 query heads (the `*_919_only_cudnn` result
    directories; GB200's and GB300's were removed at 50c8aeb, so they are cited at its
    parent 107786d):
    - H200: results/h200_919_only_cudnn/llama3.1_20260227_034703.csv @3929da2: fwd
      1.708 ms at 644, bwd 5.083 ms at 541 TFLOPS;
    - GB200: results/gb200_919_only_cudnn/llama3.1_20260226_174648.csv @107786d: fwd
      0.688 ms at 1598, bwd 2.097 ms at 1311 (cuDNN 9.22 at batch 2, @3929da2: 1393 fwd +
      bwd, 1% apart);
    - GB300: results/gb300_919_only_cudnn/llama3.1_20260226_185510.csv @107786d: fwd
      0.583 ms at 1887, bwd 1.985 ms at 1385 (cuDNN 9.22 at batch 2: 1534, 2% apart);
    - B200: none stored. Its only run (artifacts/sdpa_bf16_benchmark_results_NVIDIA_B200.csv
      @0b1577c, 2025-10-10, cuDNN 9.13.1 through PyTorch's cuDNN backend, batch 1, 128
      query heads: fwd 1.877 ms at 1171.278, bwd 5.833 ms at 942.509, 998 TFLOPS fwd + bwd)
      is of older software: GB300's run in the same directory and commit, same settings
      (artifacts/sdpa_bf16_benchmark_results_NVIDIA_GB300.csv @0b1577c: fwd 1.470 ms at
      1495.674, bwd 4.865 ms at 1130.076, 1215 fwd + bwd) is 19% below GB300's cuDNN 9.19
      run, so it is not stored: B200 keeps the fitted fraction (0.57 of 2250 = 1290
      TFLOPS), labelled an assumption, close to what the old run times GB300's software
      gain gives (998 x 1499 / 1215 = 1231, 5% apart).
    As fractions of the BF16 peak: H200 0.57, GB200 0.56, GB300 0.61. A ratio of two
    such rates is a hardware comparison only when both ran the same software, hence
    B200's omission. The same
    repository's RMSNorm results (benchmark/norms/results, cuDNN 9.19) reach 0.78 of the
    HBM bandwidth on H200, GB200 and GB300 alike, so memory-bound kernels keep the fitted
    fraction of the bandwidth (no figure stored for them).
AZURE
    Azure/AI-benchmarking-guide, Azure_Results/ND_H100_v5_results.md @ae0b6a7 (NCCL 2.18.5,
    CUDA 12.6) and ND_GB200_v6_results.md @fa79995 (NCCL 2.25.1, CUDA 12.8): one benchmark
    suite run on both. "GEMM CuBLASLt": FP8, random initialisation and 10,000 warm-up
    iterations, so a rate the GPU sustains at its power limit rather than a burst; the best
    of its listed shapes: H100 1382.2 TFLOPS (32768^3; 1377.3 at 16384^3), GB200 2906.9
    (16384^3; 2876.6 at 8192^3). The same H100 reaches 1402.6 in MAMF's burst search (2%
    apart) where GB200 reaches 3615.6 (24% above its sustained rate): Blackwell's clocks
    fall under sustained load (a B200 at its 1000 W limit runs 1965 -> ~1580 MHz,
    flashinfer-ai/flashinfer PR #2899), Hopper's hardly do. "NCCL Bandwidth": nccl-tests
    all-reduce bus bandwidth, in place, at 67M (64 MiB): 8 x H100 (NVLS) 361.78 GB/s,
    4 x GB200 in one NVL72 tray (ring) 550.73.
AZURE_GB300
    egmsft/AI-benchmarking-guide (a fork of the same guide), Azure_Results/
    ND_GB300_v6_results.md @18e80a2 (CUDA 13.0, driver 580.82.07): the same harness and
    settings on ND GB300 v6, FP8, best of the listed shapes 3308.5 TFLOPS (16384^3; 3286.3
    at 8192^3). GB300 has no MAMF row, so this is its only GEMM figure; it is divided by
    AZURE's H100 (1382.2).
Not used: huggingface/gpu-fryer's README reference table (@2b6fb06: H100 ~730 BF16 / ~1530
    FP8 TFLOPS, GB200 ~1550 / ~4300 in a later commit) and mghpcc/aicr-benchmarks'
    gpu-fryer runs of 8 x B200 for 300 s (Benchmark_WG/gpu-fryer/b0025-9553.out @292d571:
    1493 BF16, 4103 FP8 per GPU): the H100 reference is an approximate row with no run
    length or setup, and its FP8 figures sit above every other FP8 measurement of those
    GPUs (H100 1530 against 1382-1403; GB200 4300 against MAMF's 3616 burst), so they time
    some other FP8 configuration than the training GEMMs'. Their BF16 agrees in direction
    with AZURE: Blackwell keeps a smaller share of its peak than H100 under sustained load
    (B200 0.90, GB200 0.86 of H100's share; MAMF's bursts give 0.97 and 0.93).
ML_ENG_NET
    stas00/ml-engineering network/README.md @744d01e: the repository's all_reduce_bench.py
    (torch.distributed all-reduce, bus bandwidth as nccl-tests defines it) on one node each,
    64 MiB: 8 x H200 346.51 GB/s, 8 x B200 (p6-b200, NCCL 2.27.7) 400.60; at 1 GiB 463.58 and
    723.34. nccl-tests at 8 GiB in the same file: 8 x B200 838.0 (NVLS).
RCCL_MI300X
    ROCm/rocm-blogs blogs/software-tools-optimization/mi300x-rccl-xgmi/README.md @0e81c2c
    ("Understanding RCCL Bandwidth and xGMI Performance on AMD Instinct MI300X", 2025-03-02):
    rccl-tests all_reduce_perf on 8 x MI300X (RCCL 2.22.3, ROCm 6.3.0), out of place,
    without graphs: busbw 273.66 GB/s at 64 MiB, 314.72 at 1 GiB; 13.1-22.9 us from 8 B to
    2 KiB (median 16.6).
NVL5_SAME
    GB300 NVL72 has GB200 NVL72's NVLink 5 and NVLink Switch, and HGX B300 has HGX B200's:
    oracle-quickstart/oci-gpu-quickstarts @6a0abdc, nvidia/GB300/README-GB300.md (4 GPUs,
    8 GiB all-reduce 681.03 GB/s) and nvidia/GB200/README-GB200.md (663.34), against Azure's
    GB200 679.61; nvidia/B300/README-B300.md (8 GPUs, 8 GiB 834.84) against ML_ENG_NET's
    B200 838.0. Their links take the measured figures of the same links.
REF_HW
    ../shared/reference/hardware.md (the project's reference facts), "Collectives on a
    DGX H100 (nccl-tests bus bandwidth)": all-reduce inside a node about 370 GB/s (ring),
    480 GB/s with NVLink SHARP at 1 GB and more; across nodes about 45 GB/s per 400 Gb/s
    NIC; about 10-20 us latency per collective; 1 MB messages reach about 67 GB/s.

Searched without a citable number for the remaining entries: NVIDIA NeMo /
Megatron-Bridge performance pages, NVIDIA/dgxc-benchmarking and its history (its nccl
samples are all H100), AMD's ROCm blog "Measuring Max-Achievable FLOPs - Part 2", arXiv
2512.02189 "Microbenchmarking NVIDIA's Blackwell Architecture" (result tables not
readable here); no sustained GEMM rate of B200, B300 or GB300 measured beside an H100's;
no small-message latency of a Blackwell system measured as DGX H100's was.

The model uses a measured GEMM figure as a ratio to H100's (predict/constants.py,
transfer_constants): the H100 efficiencies are fitted to the seeds' step times, and
another GPU's are those times its measured-over-peak GEMM efficiency divided by the
H100's, per dtype. A ratio compares like with like: where a figure comes from a source
that measured H100 too (Figure.h100), the ratio is to that H100 figure. Where a sustained
figure exists (AZURE) it is preferred to the burst one (MAMF), as the seeds' step times
the H100 efficiencies were fitted to are sustained. Link bandwidths are carried the same
way: H100's 370 GB/s times the ratio of the GPU's all-reduce bus bandwidth at 64 MiB (the
size of a training step's buckets and tensor-parallel messages) to Hopper's in the same
benchmark.
"""

from __future__ import annotations

from dataclasses import dataclass

REF_HW = "../shared/reference/hardware.md, 'Collectives on a DGX H100 (nccl-tests bus bandwidth)'"
AZURE = ("Azure/AI-benchmarking-guide Azure_Results ND_H100_v5_results.md @ae0b6a7 and "
         "ND_GB200_v6_results.md @fa79995")
ML_ENG_NET = "stas00/ml-engineering network/README.md @744d01e, all_reduce_bench.py"
RCCL_MI300X = ("ROCm/rocm-blogs blogs/software-tools-optimization/mi300x-rccl-xgmi/README.md "
               "@0e81c2c, rccl-tests all_reduce_perf on 8 x MI300X")
AZURE_GB300 = ("egmsft/AI-benchmarking-guide Azure_Results/ND_GB300_v6_results.md @18e80a2 "
               "(the same harness), against Azure's H100 in ND_H100_v5_results.md @ae0b6a7")
NVL5_SAME = ("oracle-quickstart/oci-gpu-quickstarts @6a0abdc nvidia/{GB300,GB200,B300}/"
             "README-*.md: the same NVLink 5 links measure the same")
CUDNN_SDPA = ("NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training, causal BF16 SDPA at "
              "Llama 3.1's shape, sequence 8192, fwd + bwd")
MAMF = ("stas00/ml-engineering compute/accelerator/README.md @744d01e, 'Maximum Achievable "
        "Matmul FLOPS comparison table'")
MLPERF_SYSTEMS = ("NVIDIA's MLPerf Training system descriptions: mlcommons/training_results_v5.0 "
                  "NVIDIA/systems/nyx_n1_ngc25.04_nemo.json (DGX B200: '8x ConnectX-7 IB NDR "
                  "400Gb/s'), training_results_v5.1 @4da2d1c NVIDIA/systems/"
                  "tyche_ngpu512_ngc25.09_nemo.json (GB200 NVL72: '4x ConnectX-7 IB NDR 400 "
                  "Gb/s' per 4-GPU node)")
NCCL_H100 = ("NVIDIA/dgxc-benchmarking nccl/README.md @841f546, all_reduce_perf sample on "
             "8 x H100 80GB HBM3")

_NO_GEMM = ("no public sustained dense-GEMM figure with a readable table was found "
            "(searched NVIDIA performance pages, dgxc-benchmarking, AMD ROCm MAF blog, arXiv "
            "2512.02189); measure it with `trainbench probe` and pass --hardware")
_NO_LINK = ("no published nccl-tests result for this system was found; measure it with "
            "`trainbench probe` and pass --hardware")
_SAME_AS_H100 = ("H200 SXM boards use the same NVLink 4 / NVSwitch generation and the same "
                 "400 Gb/s ConnectX-7 NICs as DGX H100, so DGX H100's nccl-tests figures "
                 "are measurements of the same links")


@dataclass(frozen=True)
class Figure:
    """One measured figure, or None with the reason no figure is stored."""
    value: float | None
    unit: str
    source: str | None = None
    reason: str = ""
    h100: float | None = None
    """The same source's figure for an H100 measured the same way: a ratio to H100 uses it
    rather than H100's own entry, which may come from another benchmark."""

    @property
    def known(self) -> bool:
        return self.value is not None

    def describe(self) -> str:
        if self.known:
            note = f"; {self.reason}" if self.reason else ""
            return f"{self.value:g} {self.unit} (measured: {self.source}{note})"
        return f"not measured ({self.reason})"


@dataclass(frozen=True)
class MeasuredGPU:
    key: str
    gemm_tflops: dict[str, Figure]
    """Sustained dense GEMM TFLOPS per dtype at large shapes."""
    intra_node_busbw_gbs: Figure
    """All-reduce bus bandwidth inside an NVLink domain (nccl-tests, large messages)."""
    network_gbs: Figure
    """Bus bandwidth across nodes per GPU (its own NIC), nccl-tests."""
    collective_latency_us: Figure
    attention_tflops: Figure = Figure(None, "TFLOPS", reason=(
        "no published run of cudnn-frontend's training attention benchmark on it was "
        "found; `trainbench probe` times the engine's attention"))
    """Causal flash attention, forward + backward, BF16, at a seed shape (CUDNN_SDPA)."""


def _sdpa(fwd_ms: float, fwd_tflops: float, bwd_ms: float, bwd_tflops: float,
          where: str) -> Figure:
    """One fwd + bwd rate from a benchmark's forward and backward rows: FLOPs over time."""
    rate = (fwd_ms * fwd_tflops + bwd_ms * bwd_tflops) / (fwd_ms + bwd_ms)
    return Figure(round(rate, 1), "TFLOPS", CUDNN_SDPA,
                  f"{where}: fwd {fwd_ms} ms at {fwd_tflops}, bwd {bwd_ms} ms at {bwd_tflops}")


# H100 and H200 SXM share the GH100 compute (132 SMs, the same clocks and power limit);
# attention is compute-bound, so H200's run stands for both.
_HOPPER_SDPA = _sdpa(1.708, 644, 5.083, 541, "H200, cuDNN 9.19 (@3929da2); H100 has the "
                     "same GH100 compute")


def _gemm_unknown(*dtypes: str) -> dict[str, Figure]:
    return {d: Figure(None, "TFLOPS", reason=_NO_GEMM) for d in dtypes}


def _mamf(bf16: float | None, fp8: float | None, bf16_note: str = "") -> dict[str, Figure]:
    out = {}
    for dtype, value in (("bf16", bf16), ("fp8", fp8)):
        note = bf16_note if dtype == "bf16" else ""
        out[dtype] = (Figure(value, "TFLOPS", MAMF, note) if value is not None else
                      Figure(None, "TFLOPS", reason="the MAMF table's row for it is empty; "
                             + _NO_GEMM))
    return out


FLASHINFER_B200_CLOCKS = (
    "flashinfer-ai/flashinfer PR #2899 ('bench: fix GPU power throttling in benchmark "
    "utilities'): a B200 at its 1000 W limit runs kernels back to back at about 1580 MHz "
    "of its 1965 MHz")
B200_SUSTAINED_CLOCK_SHARE = 1580 / 1965
"""The share of its boost clock a B200 holds under sustained load (FLASHINFER_B200_CLOCKS).
A dense GEMM's rate is its SMs' work per clock times the clock, so B200's sustained GEMM
rate is its MAMF burst times this share: 0.804, the share of its burst that GB200's FP8
GEMMs sustain in AZURE's harness (2906.9 / 3615.6) too."""


def _clock_limited(burst: float) -> Figure:
    return Figure(round(burst * B200_SUSTAINED_CLOCK_SHARE, 1), "TFLOPS",
                  f"{MAMF}; {FLASHINFER_B200_CLOCKS}",
                  f"MAMF's burst {burst:g} x the 1580 / 1965 MHz a B200 holds under "
                  "sustained load")


# AZURE's harness: cuBLASLt FP8 after 10,000 warm-up iterations, the best listed shape.
_AZURE_H100_FP8 = 1382.2
_GB200_FP8_BURST = 3615.6  # MAMF's row, replaced by the sustained figure below


def _azure_fp8(tflops: float, source: str, note: str = "") -> Figure:
    return Figure(tflops, "TFLOPS", source, "cuBLASLt after 10,000 warm-up iterations, "
                  "16384^3" + note, h100=_AZURE_H100_FP8)


H100_BUSBW_GBS = 370.0
"""H100's all-reduce bus bandwidth inside a node, as the model charges it (_H100_LINKS)."""


def _busbw_vs_hopper(gbs: float, hopper_gbs: float, source: str, where: str) -> Figure:
    """A link's bus bandwidth as H100's charged figure times the ratio of the GPU's
    all-reduce bus bandwidth to Hopper's in the same benchmark at 64 MiB."""
    ratio = gbs / hopper_gbs
    return Figure(round(H100_BUSBW_GBS * ratio), "GB/s", source,
                  f"{where}: {gbs:g} GB/s at 64 MiB against Hopper's {hopper_gbs:g} in the "
                  f"same benchmark, {ratio:.3f} x H100's {H100_BUSBW_GBS:g}")


def _same_links(fig: Figure, what: str) -> Figure:
    return Figure(fig.value, fig.unit, f"{fig.source}; {NVL5_SAME}",
                  f"{fig.reason}; {what}")


_B200_NVLINK = _busbw_vs_hopper(400.60, 346.51, ML_ENG_NET, "8 x B200 against 8 x H200")
_GB200_NVLINK = _busbw_vs_hopper(550.73, 361.78, AZURE, "4 x GB200 (one NVL72 tray, ring) "
                                 "against 8 x H100 (NVLS)")
_NETWORK_UNKNOWN = Figure(None, "GB/s", reason=_NO_LINK)
_LATENCY_UNKNOWN = Figure(None, "us", reason=(
    "no small-message all-reduce time of this system measured as DGX H100's was (nccl-tests "
    "without graphs); NVIDIA's 'just over 3 us' for 8 x B200 (NVIDIA/nccl-tests issue 333) "
    "is a tuned symmetric-memory run"))


# DGX B200 and GB200 NVL72 reach other nodes through the NIC DGX H100 has, one 400 Gb/s
# ConnectX-7 per GPU, so DGX H100's per-NIC bus bandwidth is a measurement of that link.
_CX7_PER_GPU = Figure(45.0, "GB/s", REF_HW + "; " + MLPERF_SYSTEMS,
                      "one 400 Gb/s ConnectX-7 per GPU, the NIC of DGX H100")


_H100_LINKS = dict(
    # The model charges one bus bandwidth per collective; the buckets and TP messages of a
    # training step are tens of MiB, where the sample measures 362 GB/s (64 MiB) and the
    # reference about 370 (ring). 466-480 GB/s needs 1 GiB and more (NVLS).
    intra_node_busbw_gbs=Figure(H100_BUSBW_GBS, "GB/s", REF_HW + "; " + NCCL_H100,
                                "361.67 GB/s at 64 MiB in the nccl-tests sample"),
    network_gbs=Figure(45.0, "GB/s", REF_HW),
    # 13-17 us for small all-reduces in the sample; the reference gives 10-20 us.
    collective_latency_us=Figure(15.0, "us", REF_HW + "; " + NCCL_H100),
)

MEASURED: dict[str, MeasuredGPU] = {
    "h100": MeasuredGPU("h100", _mamf(794.5, 1402.6), **_H100_LINKS,
                        attention_tflops=_HOPPER_SDPA),
    "h200": MeasuredGPU("h200", _mamf(794.5, 1453.4, "the table's H100 row, noted 'H200 is "
                                      "the same'"),
                        **{k: Figure(f.value, f.unit, f.source, _SAME_AS_H100)
                           for k, f in _H100_LINKS.items()},
                        attention_tflops=_HOPPER_SDPA),
    # Burst rates at the clock a B200 sustains: a training step's GEMMs run back to back.
    "b200": MeasuredGPU("b200", {"bf16": _clock_limited(1745.0), "fp8": _clock_limited(3432.5)},
                        intra_node_busbw_gbs=_B200_NVLINK,
                        network_gbs=_CX7_PER_GPU, collective_latency_us=_LATENCY_UNKNOWN,
                        attention_tflops=Figure(None, "TFLOPS", reason=(
                            "its only published run of cudnn-frontend's training attention "
                            "benchmark is of cuDNN 9.13.1 (@0b1577c), older than the Hopper "
                            "figure's 9.19, and GB300's run of that software is 19% below its "
                            "cuDNN 9.19 one; `trainbench probe` times the engine's attention"))),
    "b300": MeasuredGPU("b300", _mamf(1769.0, 3353.3),
                        intra_node_busbw_gbs=_same_links(_B200_NVLINK, "HGX B300 has HGX "
                                                         "B200's NVLink 5 (8 GiB: 834.84 "
                                                         "against 838.0 GB/s)"),
                        network_gbs=_NETWORK_UNKNOWN,
                        collective_latency_us=_LATENCY_UNKNOWN),
    # The table's GB200 'Theory' is 2500 / 5000; the efficiency here is against the
    # catalog's 2450 / 4900 (catalog.hardware), the peak predict divides by.
    # FP8: the sustained rate (AZURE), not MAMF's burst 3615.6; BF16 has no sustained
    # figure, so it keeps MAMF's.
    "gb200": MeasuredGPU("gb200", {
        "bf16": Figure(1822.0, "TFLOPS", MAMF, "a burst rate: no sustained BF16 figure of "
                       "GB200 was found; its FP8 sustains 20% below its burst"),
        "fp8": _azure_fp8(2906.9, AZURE, f"; MAMF's burst rate is {_GB200_FP8_BURST:g}")},
                         intra_node_busbw_gbs=_GB200_NVLINK, network_gbs=_CX7_PER_GPU,
                         collective_latency_us=_LATENCY_UNKNOWN,
                         attention_tflops=_sdpa(0.688, 1598, 2.097, 1311,
                                                "GB200, cuDNN 9.19 (@107786d)")),
    "gb300": MeasuredGPU("gb300", {
        **_gemm_unknown("bf16"),
        "fp8": _azure_fp8(3308.5, AZURE_GB300)},
                         intra_node_busbw_gbs=_same_links(_GB200_NVLINK, "GB300 NVL72 has "
                                                          "GB200 NVL72's NVLink 5 (4 GPUs, 8 "
                                                          "GiB: 681.03 against 663.34-679.61 "
                                                          "GB/s)"),
                         network_gbs=_NETWORK_UNKNOWN,
                         collective_latency_us=_LATENCY_UNKNOWN,
                         attention_tflops=_sdpa(0.583, 1887, 1.985, 1385,
                                                "GB300, cuDNN 9.19 (@107786d)")),
    "mi300x": MeasuredGPU("mi300x", _mamf(668.4, None),
                          intra_node_busbw_gbs=_busbw_vs_hopper(273.66, 361.67, RCCL_MI300X + "; "
                                                                + NCCL_H100, "8 x MI300X "
                                                                "(rccl-tests) against 8 x H100 "
                                                                "(nccl-tests)"),
                          network_gbs=_NETWORK_UNKNOWN,
                          collective_latency_us=Figure(16.6, "us", RCCL_MI300X, (
                              "median of 8 B to 2 KiB, 13.1-22.9 us, out of place, without "
                              "graphs, as DGX H100's 13-17 us were measured")))
}

LINK_FIELDS = ("intra_node_busbw_gbs", "network_gbs", "collective_latency_us")

def measured_for(gpu_type: str) -> MeasuredGPU | None:
    return MEASURED.get(gpu_type.lower())
