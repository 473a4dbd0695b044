"""The model's efficiency constants: one set per GPU type, never per workload.

Each constant is a physical quantity (a fraction of a peak, an overlap fraction, a
kernel size at which efficiency halves), so a value can be checked against a
micro-benchmark and a calibrated value can be read. `trainbench predict --calibrate`
stores fitted values in the cluster config:

    calibration:
      h100: {gemm_eff_bf16: 0.81, attn_eff: 0.52, ...}

and `constants_for` lays them over the defaults below. Pure Python.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from ..catalog import hardware, measured

CALIBRATION_KEY = "calibration"


@dataclass(frozen=True)
class Constants:
    # --- compute -------------------------------------------------------------------------
    gemm_eff_bf16: float = 0.70
    """Fraction of the BF16 dense peak a large GEMM reaches (cuBLAS on H100: ~0.75-0.8)."""
    gemm_eff_fp8: float = 0.70
    """Fraction of the FP8 dense peak a large FP8 GEMM reaches. 0.66 until the output head
    (BF16 in every FP8 recipe) stopped being charged the FP8 peak; the refit on the H100
    seed cells then reaches the measured best FP8 matmul, 0.709 (catalog.measured), and
    one H100 ran the seed shapes at 0.679 (`trainbench probe`, README "On a GPU")."""
    gemm_half_dim: float = 90.0
    """Smallest GEMM dimension at which efficiency is half its large-matrix value: the
    fall-off of small (e.g. TP-split) matrices, eff = eff_max * d / (d + gemm_half_dim)."""
    attn_eff: float = 0.38
    """Flash attention forward + backward, fraction of the BF16 peak on causal FLOPs
    (attention stays BF16 in the FP8 recipes)."""
    attn_half_len: float = 450.0
    """Sequence length per attention kernel at which flash attention's efficiency halves."""
    scan_eff: float = 0.0
    """A measured rate of the whole Mamba-2 SSD scan, as a fraction of the BF16 peak, or 0.

    0 (the default) derives the scan from the operation's arithmetic, like every other
    kernel: its matmuls at the GEMM fall-off of their smallest side (the head dim: 64 gives
    0.70 x 64 / 154 = 0.29 of peak) and its kernels' HBM traffic (work.ssd_scan_bytes,
    counted from mamba_ssm's Triton kernels: 311 KB per token at a TP8 rank of Nemotron-H
    56B) at the memory-bound rate: 0.241 us per token at that rank on H100, within 2% of
    what Nemotron-H's H100 cells imply (0.245). A `trainbench probe` profile
    (predict --hardware) sets it from the scan the probe timed, which then replaces both
    the matmul and the traffic terms."""
    torch_scan_compiled: float = 1.45
    """The engine's torch scan (conv, chunked SSD scan, gated norm), compiled with its
    block, against the kernels' derived time above: 0.349 against 0.241 us per token for
    a TP8 rank's heads of Nemotron-H 56B, timed on one H200 (8,192 tokens, torch 2.11;
    issue 38's measurement). Charged where a plan runs the torch scan (ssd_scan=torch)."""
    torch_scan_eager: float = 4.0
    """The same scan eager (`--set compile=false`): 0.967 against 0.241 us per token."""
    hbm_eff: float = 0.45
    """Fraction of the HBM bandwidth memory-bound kernels (norms, activations, casts) reach."""
    stream_eff: float = 0.82
    """Fraction of the HBM bandwidth one streaming pass over a whole large tensor reaches (a
    weight's cast, a gradient's accumulation): `trainbench probe`'s large copy moved 2.74
    TB/s, read and write counted, on one H100 80GB HBM3 of 3.35 TB/s
    (docs/gpu-runs/2026-11-26-h100/probe.log). Measured, not fitted; carried to other
    GPU types as a fraction of their peak."""
    eager_upcast_eff: float = 0.45
    """Fraction of the HBM bandwidth torch's eager bf16-to-fp32 copy reaches (the loss
    upcasting its logits, the engine's eager weights' gradients cast back to fp32). Its
    copy kernel casts element by element, unvectorised: 2.15 TB/s over 805M elements
    (read 2, write 4 B) on one H200 of 4.8 TB/s, where the fp32-to-bf16 cast reached 4.33
    and the same upcast compiled 4.10 (docs/gpu-runs/2026-11-28-h200/cast_bench.log).
    Measured, not fitted."""
    fused_adam_eff: float = 0.76
    """Fraction of the HBM bandwidth a fused Adam kernel (one multi-tensor kernel over
    weights, gradients and both moments) reaches: torch's fused AdamW took 21.2 ms over
    the 1,923,125,248 parameters of the Llama 3.1 8B 4-layer proxy, 28 B each, on one H100
    80GB HBM3 (the profiled step in docs/gpu-runs/2026-11-26-h100/gpu_mfu.log): 2.54 of
    3.35 TB/s. An operator's own time in a profile, not fitted to step times."""
    layer_overhead_us: float = 30.0
    """Fixed time per layer per microbatch, forward + backward: kernel launches, small
    kernels the FLOP and byte counts miss."""
    # --- communication -------------------------------------------------------------------
    tp_overlap: float = 0.4
    """Fraction of tensor/sequence-parallel collectives hidden behind GEMMs."""
    cp_overlap: float = 0.8
    """Fraction of the context-parallel K/V exchange hidden behind attention."""
    pp_overlap: float = 0.5
    """Fraction of pipeline point-to-point sends hidden behind compute."""
    dp_overlap: float = 0.9
    """Share of the compute window that data-parallel / FSDP collectives can hide behind."""
    ring_hop_us: float = 2.0
    """Latency each step of a ring collective adds (a bucket's all-gather over n ranks
    waits about n-1 hops)."""
    comm_slowdown: float = 0.1
    """Compute slow-down per second of hidden communication (SMs and HBM the NCCL kernels
    take while they overlap compute)."""
    # --- memory --------------------------------------------------------------------------
    fragmentation: float = 0.07
    """Allocator fragmentation, as a share of activation and logits memory."""
    buffers_gib: float = 1.0
    """Communication buffers and workspaces inside the allocator (NCCL, cuBLAS, TE)."""
    context_gib: float = 0.75
    """CUDA context and driver memory outside the allocator (counts against capacity)."""

    def to_dict(self) -> dict:
        return asdict(self)

    def with_values(self, values: dict) -> "Constants":
        return replace(self, **values)


FIELDS = tuple(f.name for f in fields(Constants))

# Per GPU type. Hopper values come from the H100 reference cells (bench/predict_accuracy.py);
# other types start from the same efficiencies, carried by the public measured figures of
# catalog.measured (transfer_constants; an assumption, labelled, where none is stored),
# until a calibration (`trainbench predict --calibrate`) or a probe profile (`predict
# --hardware`) measures them.
DEFAULTS: dict[str, Constants] = {
    "h100": Constants(),
    "h200": Constants(),
}


# The GPU type the default efficiencies were fitted on (the seeds' cells).
FITTED_ON = "h100"


def default_constants(gpu_type: str) -> Constants:
    """The defaults of a GPU type: the H100-fitted set, its GEMM efficiencies carried to
    another type by the measured GEMM figures of catalog.measured (transfer_constants)."""
    base = DEFAULTS.get(gpu_type.lower(), Constants())
    return transfer_constants(base, gpu_type)[0]


def transfer_constants(c: Constants, gpu_type: str, from_type: str = FITTED_ON
                       ) -> tuple[Constants, dict[str, str]]:
    """Constants fitted on `from_type` carried to `gpu_type`, with where each carried
    efficiency came from.

    gemm_eff is what a training step's GEMMs reach as a fraction of the peak; the public
    figure is the best large-matmul rate (catalog.measured). The step's share of that best
    rate is taken to be the same on both types, so per dtype
    eff(gpu) = eff(from) * (measured(gpu) / peak(gpu)) / (measured(from) / peak(from)).
    attn_eff is carried the same way by the measured flash-attention rate (cuDNN's causal
    fwd + bwd at a seed shape, one cuDNN release for all) over the BF16 peak: on GB300 it
    reaches 0.61 of the peak where Hopper reaches 0.57, so it is charged 7% above the
    peak-scaled rate.
    A figure from a benchmark that measured H100 too (catalog.measured Figure.h100, e.g.
    GB200's sustained FP8 GEMM) is divided by that H100 figure, not H100's own entry.
    Where either figure is missing the fraction stays the fitted one, labelled assumed."""
    gpu_type, from_type = gpu_type.lower(), from_type.lower()
    if gpu_type == from_type or gpu_type not in hardware.GPUS:
        return c, {}
    to_fig, from_fig = measured.measured_for(gpu_type), measured.measured_for(from_type)
    # (constant, peak dtype, the measured figure of an entry)
    carried = [(f"gemm_eff_{d}", d, lambda e, d=d: e.gemm_tflops.get(d)) for d in ("bf16", "fp8")]
    carried.append(("attn_eff", "bf16", lambda e: e.attention_tflops))
    values, labels = {}, {}
    for name, dtype, figure_of in carried:
        a = figure_of(to_fig) if to_fig else None
        b = figure_of(from_fig) if from_fig else None
        peak_to = hardware.GPUS[gpu_type].peak(dtype)
        peak_from = hardware.GPUS[from_type].peak(dtype)
        if a is None or b is None or not (a.known and b.known and peak_to and peak_from):
            why = a.reason if a is not None and not a.known else "no measured figure"
            labels[name] = (f"assumed: the {from_type.upper()}-fitted fraction of peak applied "
                            f"to this GPU's peak ({why})")
            continue
        # Like with like: the H100 figure of the same source where it measured one.
        ref = a.h100 if a.h100 is not None and from_type == "h100" else b.value
        ratio = (a.value / peak_to) / (ref / peak_from)
        values[name] = getattr(c, name) * ratio
        labels[name] = (f"measured: {a.value:g} of {peak_to:g} TFLOPS ({a.source}"
                        f"{'; ' + a.reason if a.reason else ''}) against "
                        f"{from_type.upper()}'s {ref:g} of {peak_from:g}"
                        f"{' in the same benchmark' if ref != b.value else ''}: the "
                        f"{from_type.upper()}-fitted {getattr(c, name):.3g} x {ratio:.3f}")
    return replace(c, **values), labels


def calibrated_values(config: dict, gpu_type: str) -> dict:
    """The calibrated constants of one GPU type from the cluster config ({} when none)."""
    section = config.get(CALIBRATION_KEY) or {}
    if not isinstance(section, dict):
        raise ValueError(f"cluster config key '{CALIBRATION_KEY}' must be a mapping of GPU type "
                         "to constants")
    entry = section.get(gpu_type.lower()) or {}
    if not isinstance(entry, dict):
        raise ValueError(f"cluster config '{CALIBRATION_KEY}.{gpu_type}' must be a mapping")
    out = {}
    for key, value in entry.items():
        if key.startswith("_"):
            continue  # bookkeeping (runs used, errors) stored beside the constants
        if key not in FIELDS:
            raise ValueError(f"cluster config '{CALIBRATION_KEY}.{gpu_type}.{key}': unknown "
                             f"constant; known: {', '.join(FIELDS)}")
        if not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"cluster config '{CALIBRATION_KEY}.{gpu_type}.{key}' must be a "
                             "non-negative number")
        out[key] = float(value)
    return out


def constants_for(gpu_type: str, config: dict | None = None) -> Constants:
    """Defaults for the GPU type with the cluster config's calibration laid over them."""
    base = default_constants(gpu_type)
    values = calibrated_values(config or {}, gpu_type)
    return base.with_values(values) if values else base
