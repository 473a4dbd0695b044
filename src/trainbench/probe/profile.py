"""The probe's arithmetic and its profile format; no torch here, so the launcher, the
report and the tests use it without starting a rank.

Bandwidth conventions are nccl-tests' (doc/PERFORMANCE.md in NVIDIA/nccl-tests):
algorithm bandwidth is size / time, with size S the whole buffer of one rank (all-gather:
the gathered output; reduce-scatter: the input before scattering; all-to-all: the buffer
each rank sends). Bus bandwidth rescales it to what each rank's link carried, so that it
can be compared with the hardware's link bandwidth whatever the number of ranks n:

- all-reduce: every element needs n-1 additions and n assignments, 2(n-1) transfers
  spread over n links, so t = (S/B) * 2(n-1)/n and busbw = algbw * 2(n-1)/n;
- all-gather and reduce-scatter: only one of those halves, busbw = algbw * (n-1)/n;
- all-to-all: each rank keeps 1/n of its buffer and sends the rest, busbw = algbw * (n-1)/n;
- send/recv: one link, one copy, busbw = algbw.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

from ..catalog import hardware
from ..catalog.models import MODELS

SCHEMA = 1
PROFILE_FILE = "hardware-profile.json"
PLOT_FILE = "bandwidth.png"
PLAN_FILE = "probe-plan.json"

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
# More than this far below the median of its peers is a slow rank, group or node.
SLOW_FRACTION = 0.05

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
DEFAULT_MIN_SIZE = KIB
DEFAULT_MAX_SIZE_GPU = GIB
# gloo on a few shared cores: 4 MiB keeps the whole sweep to seconds.
DEFAULT_MAX_SIZE_CPU = 4 * MIB
MAX_SIZE_LIMIT = 16 * GIB

# Hook for tests: "RANK:SPEED" (e.g. "1:0.5") makes that rank's GEMMs and copies run at
# SPEED of their real rate, by really waiting inside the timed region.
SLOW_RANK_ENV = "TRAINBENCH_PROBE_SLOW_RANK"


class ProbeError(ValueError):
    """A problem with the probe's input, in one line that says how to fix it."""


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw for `op` over n ranks (nccl-tests' correction factors)."""
    if n < 1:
        raise ValueError(f"a collective needs at least one rank, not {n}")
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == "send_recv":
        return 1.0
    raise ValueError(f"unknown collective {op!r}; known: {', '.join(COLLECTIVES)}")


def algbw_gbs(size_bytes: int, time_s: float) -> float:
    """Algorithm bandwidth in GB/s (10^9 bytes, as nccl-tests prints)."""
    return size_bytes / time_s / 1e9


def busbw_gbs(op: str, n: int, size_bytes: int, time_s: float) -> float:
    return algbw_gbs(size_bytes, time_s) * bus_factor(op, n)


_SIZE = re.compile(r"(\d+)\s*(?:([kmg])(?:i?b)?|b)?", re.IGNORECASE)


def parse_size(text: str, option: str) -> int:
    """'64MiB', '64M', '1GiB', '4096' -> bytes (binary units: K, M and G are 2^10, 2^20,
    2^30, as message sizes are powers of two)."""
    m = _SIZE.fullmatch(str(text).strip())
    if not m:
        raise ProbeError(f"{option} {text!r} is not a size; use bytes or a number with K, M "
                         "or G (binary units), e.g. 64M or 1GiB")
    return int(m.group(1)) * {"": 1, "k": KIB, "m": MIB, "g": GIB}[(m.group(2) or "").lower()]


def message_sizes(min_size: int, max_size: int) -> list[int]:
    """Powers of two from min_size up to max_size (min_size rounded up to one)."""
    if min_size < 8:
        raise ProbeError(f"--min-size {min_size} B is too small; use at least 8 bytes "
                         "(two float32 elements)")
    if max_size > MAX_SIZE_LIMIT:
        raise ProbeError(f"--max-size {max_size} B is above the {MAX_SIZE_LIMIT >> 30} GiB "
                         "limit; use --max-size 1G or so")
    if min_size > max_size:
        raise ProbeError(f"--min-size {fmt_bytes(min_size)} is larger than --max-size "
                         f"{fmt_bytes(max_size)}; lower --min-size or raise --max-size")
    size = 1 << math.ceil(math.log2(min_size))
    sizes = []
    while size <= max_size:
        sizes.append(size)
        size *= 2
    if not sizes:
        raise ProbeError(f"no power of two lies between --min-size {fmt_bytes(min_size)} and "
                         f"--max-size {fmt_bytes(max_size)}; widen the range")
    return sizes


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= scale:
            value = n / scale
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{int(n)} B"


def parse_slow_rank(text: str | None) -> tuple[int, float] | None:
    """The test hook's value 'RANK:SPEED' -> (rank, speed), None when unset."""
    if not text:
        return None
    try:
        rank_text, speed_text = text.split(":")
        rank, speed = int(rank_text), float(speed_text)
    except ValueError:
        raise ProbeError(f"{SLOW_RANK_ENV}={text!r}: use RANK:SPEED, e.g. 1:0.5") from None
    if rank < 0 or not 0 < speed <= 1:
        raise ProbeError(f"{SLOW_RANK_ENV}={text!r}: the rank must be >= 0 and the speed in "
                         "(0, 1]")
    return rank, speed


# --- GEMM shapes ------------------------------------------------------------------------------

# The seed workloads' largest GEMMs: the MLP's up (gate and up share it) and down
# projections of Llama 3.1 8B and 70B over one microbatch (MBS 1 x 8192 tokens), whole
# (a TP rank runs the same GEMM with the FFN dimension divided by TP).
_SEED_MODELS = (("pretrain_llama3.1", "8b"), ("pretrain_llama3.1", "70b"))
TOKENS = 8192
# CPU GEMM throughput saturates well below the real shapes; scaled down, a probe takes
# seconds instead of minutes.
CPU_MAX_DIM = 1024


def gemm_shapes(device: str) -> list[dict]:
    """[{name, m, k, n}] for C[m, n] = A[m, k] @ W[n, k]^T (nn.Linear's layout). On a CPU
    each shape is scaled by one factor so its largest side is CPU_MAX_DIM (its aspect
    kept), each side a multiple of 16 (what FP8 GEMMs need on a GPU too)."""
    shapes = []
    for key in _SEED_MODELS:
        spec = MODELS[key]
        for what, k, n in (("MLP up", spec.hidden, spec.ffn), ("MLP down", spec.ffn, spec.hidden)):
            m = TOKENS
            name = f"{spec.name} {what}"
            if device == "cpu":
                factor = max(m, k, n) / CPU_MAX_DIM
                m, k, n = (max(16, int(d / factor) // 16 * 16) for d in (m, k, n))
                name += " (scaled)"
            shapes.append({"name": name, "m": m, "k": k, "n": n})
    return shapes


# Causal attention at Llama 3.1 8B's heads (32 query, 8 KV, 128 wide) over one 8192-token
# sequence, the seed workloads' attention kernel; on a CPU a scaled one (seconds, not
# minutes), in fp32 (a CPU without native bf16 runs bf16 attention as an emulation).
CPU_ATTENTION = {"seq": 512, "heads": 8, "kv_heads": 2, "head_dim": 64}


def attention_shape(device: str) -> dict:
    """{name, seq, heads, kv_heads, head_dim, dtype} of the attention the probe times."""
    spec = MODELS[("pretrain_llama3.1", "8b")]
    if device == "cpu":
        return {"name": f"{spec.name} attention (scaled)", **CPU_ATTENTION, "dtype": "fp32"}
    return {"name": f"{spec.name} attention", "seq": TOKENS, "heads": spec.heads,
            "kv_heads": spec.kv_heads, "head_dim": spec.head_dim, "dtype": "bf16"}


def attention_flops(shape: dict) -> float:
    """Causal attention, forward and backward, one sequence: 6 x s^2 x heads x head_dim
    (QK^T and AV, 2 FLOPs a multiply-add, half the scores under the causal mask, the
    backward twice the forward): the count predict's model charges attention
    (flops.attention_layer_flops_causal's score term)."""
    return 6.0 * shape["seq"] ** 2 * shape["heads"] * shape["head_dim"]


# The Mamba-2 SSD scan of one TP8 rank of Nemotron-H 56B (its seed layout): 32 of the 256
# heads of 64, one of the 8 groups of B and C (state 256), chunks of 128, over one
# 8192-token sequence; on a CPU a scaled one in fp32.
CPU_SCAN = {"seq": 512, "heads": 4, "head_dim": 16, "state": 16, "groups": 1, "chunk": 32}
SCAN_TP = 8


def scan_shape(device: str) -> dict:
    """{name, seq, heads, head_dim, state, groups, chunk, dtype} of the scan the probe times."""
    spec = MODELS[("pretrain_nemotronh", "56b")]
    if device == "cpu":
        return {"name": f"{spec.name} SSD scan (scaled)", **CPU_SCAN, "dtype": "fp32"}
    return {"name": f"{spec.name} SSD scan (one TP{SCAN_TP} rank)", "seq": TOKENS,
            "heads": spec.mamba_heads // SCAN_TP, "head_dim": spec.mamba_head_dim,
            "state": spec.mamba_state, "groups": max(1, spec.mamba_groups // SCAN_TP),
            "chunk": spec.mamba_chunk, "dtype": "bf16"}


def scan_flops(shape: dict) -> float:
    """The chunked SSD scan, forward and backward, one sequence, as predict counts it
    (flops.mamba_layer_flops's scan term): 6 x s x heads x (Q/2 (N + P) + 2 N P)."""
    q, n, p = shape["chunk"], shape["state"], shape["head_dim"]
    return 6.0 * shape["seq"] * shape["heads"] * (q / 2 * (n + p) + 2 * n * p)


def share_of_peak(gpu_type: str, dtype: str, tflops: float) -> str | None:
    """A measured GEMM rate against the catalog's dense peak for the GPU type ('80.4% of
    989'), flagged when above it (the GPU is not what --gpu says); None where the catalog
    has no peak (a CPU, an unknown GPU, fp32)."""
    gpu = hardware.GPUS.get(gpu_type)
    peak = gpu.peak_tflops.get(dtype) if gpu else None
    if not peak:
        return None
    if tflops > peak:
        return (f"INVALID: above the {gpu.name}'s {peak:g} TFLOPS {dtype} peak; is this "
                "really that GPU (--gpu)?")
    return f"{100 * tflops / peak:.1f}% of {peak:g}"


# --- the verdict ------------------------------------------------------------------------------

def _below(value: float, peers: list[float]) -> float | None:
    """How far value lies below the median of peers (0.2 = 20% below), or None when it
    is within SLOW_FRACTION or there are no peers."""
    if not peers:
        return None
    median = statistics.median(peers)
    if median <= 0:
        return None
    shortfall = 1 - value / median
    return shortfall if shortfall > SLOW_FRACTION else None


def rank_metrics(rank: dict) -> dict[str, float]:
    """The figures a rank is compared on: its best GEMM TFLOPS per dtype over the shapes
    (one shape's timing is noisier than the best of several), its sustained GEMM TFLOPS
    per dtype and its copy GB/s (health_verdict compares CPU ranks of one host on neither
    of the last two)."""
    metrics: dict[str, float] = {}
    for g in rank.get("gemm", []):
        if g.get("tflops"):
            key = f"{g['dtype']} GEMM TFLOPS"
            metrics[key] = max(metrics.get(key, 0.0), g["tflops"])
    # A GPU that throttles (power, heat) shows under sustained load, not in a burst.
    for g in rank.get("gemm_sustained") or []:
        if g.get("tflops"):
            metrics[f"{g['dtype']} {SUSTAINED_METRIC}"] = g["tflops"]
    if rank.get("memory", {}).get("gbs"):
        metrics[MEMORY_METRIC] = rank["memory"]["gbs"]
    return metrics


MEMORY_METRIC = "memory bandwidth GB/s"
SUSTAINED_METRIC = "sustained GEMM TFLOPS"


def _host_shared(metric: str) -> bool:
    """Metrics two CPU ranks of one host disturb each other on: copies through the same
    RAM, and long GEMM runs on the same cores and power budget."""
    return metric == MEMORY_METRIC or metric.endswith(SUSTAINED_METRIC)


def _share_memory(rank: dict, other: dict) -> bool:
    """Two CPU ranks on one host copy through the same RAM at the same time, so a gap
    between their copy rates is contention, not a slow device (a GPU's copy stays in its
    own HBM). The worker records `threads` for CPU ranks only."""
    return (rank.get("threads") is not None and other.get("threads") is not None
            and rank["host"] == other["host"])


def _where(rank: dict) -> str:
    return f"rank {rank['rank']} ({rank['host']}, local index {rank['local_rank']})"


def shared_gpu_nodes(ranks: list[dict]) -> list[str]:
    """'host (GPU 0, 3)' for each node whose GPUs another process used while the probe
    timed them (the node's telemetry, recorded on its local rank 0)."""
    out = []
    for rank in ranks:
        tel = rank.get("telemetry") if isinstance(rank, dict) else None
        shared = tel.get("shared_gpus") if isinstance(tel, dict) else None
        if isinstance(shared, list) and shared:
            out.append(f"{rank.get('host')} (GPU {', '.join(str(g) for g in shared)})")
    return out


def conditions_notes(ranks: list[dict]) -> list[str]:
    """The verdict's notes on how the figures were taken: GPUs another process shared,
    clocks throttled."""
    notes = []
    shared = shared_gpu_nodes(ranks)
    if shared:
        notes.append(f"another process used these GPUs while they were timed: "
                     f"{'; '.join(shared)}: the figures are not the hardware's alone; "
                     "probe them again when nothing else runs on them")
    for rank in ranks:
        tel = rank.get("telemetry") if isinstance(rank, dict) else None
        if isinstance(tel, dict) and tel.get("throttled"):
            notes.append(f"{rank.get('host')}: clocks throttled while timed "
                         f"({', '.join(tel.get('throttle_reasons') or [])})")
    return notes


def health_verdict(ranks: list[dict], collectives: list[dict]) -> dict:
    """Slow ranks (a GEMM or memory figure more than 5% below the median of the other
    ranks) and slow groups (the bus bandwidth at the largest size more than 5% below the
    median of the other groups of the same kind), each named with host and index. CPU
    ranks are not compared on copy bandwidth or sustained GEMMs with ranks of their own host
    (_share_memory), and the verdict's notes say so."""
    findings, notes = [], []
    for rank in ranks:
        mine = rank_metrics(rank)
        worst = None
        for metric, value in mine.items():
            peers = [rank_metrics(other).get(metric) for other in ranks if other is not rank
                     and not (_host_shared(metric) and _share_memory(rank, other))]
            shortfall = _below(value, [p for p in peers if p is not None])
            if shortfall is not None and (worst is None or shortfall > worst[1]):
                worst = (metric, shortfall, value, statistics.median(
                    [p for p in peers if p is not None]))
        if worst:
            metric, shortfall, value, median = worst
            findings.append({
                "kind": "rank", "rank": rank["rank"], "host": rank["host"],
                "local_rank": rank["local_rank"], "metric": metric,
                "value": value, "peer_median": median, "below_pct": round(100 * shortfall, 1),
                "message": f"{_where(rank)}: {metric} {value:.4g} is {100 * shortfall:.0f}% "
                           f"below the median of its peers ({median:.4g})"})
    by_kind: dict[tuple[str, str], list[dict]] = {}
    for c in collectives:
        by_kind.setdefault((c["group_kind"], c["op"]), []).append(c)
    for (kind, op), groups in by_kind.items():
        for c in groups:
            last = c["results"][-1]
            peers = [g["results"][-1]["busbw_gbs"] for g in groups
                     if g is not c and g["results"][-1]["size"] == last["size"]]
            shortfall = _below(last["busbw_gbs"], peers)
            if shortfall is not None:
                findings.append({
                    "kind": "group", "group": c["group"], "hosts": c["hosts"], "op": op,
                    "value": last["busbw_gbs"], "peer_median": statistics.median(peers),
                    "below_pct": round(100 * shortfall, 1),
                    "message": f"{c['group']} ({', '.join(c['hosts'])}): {op} bus bandwidth "
                               f"{last['busbw_gbs']:.3g} GB/s at {fmt_bytes(last['size'])} is "
                               f"{100 * shortfall:.0f}% below its peers' median "
                               f"({statistics.median(peers):.3g} GB/s)"})
    notes.extend(conditions_notes(ranks))
    if any(_share_memory(a, b) for i, a in enumerate(ranks) for b in ranks[i + 1:]):
        notes.append("copy bandwidth and sustained GEMM rates are not compared between CPU "
                     "ranks of one host: they share its memory and cores, so a gap between "
                     "them is contention, not a slow device")
    compared = len(ranks) > 1
    if findings:
        status = "slow"
    else:
        status = "healthy" if compared else "not compared (one rank has no peers)"
    return {"status": status, "threshold_pct": 100 * SLOW_FRACTION, "findings": findings,
            "notes": notes}


# --- the profile file -------------------------------------------------------------------------

def collective_entry(op: str, group: str, group_kind: str, ranks: list[int], hosts: list[str],
                     timings: list[tuple[int, float]]) -> dict:
    """One collective over one group: [(size in bytes, seconds per call)] -> time, algbw,
    busbw per size and the latency (the time at the smallest size)."""
    n = len(ranks)
    results = [{"size": size, "time_us": round(t * 1e6, 3),
                "algbw_gbs": algbw_gbs(size, t), "busbw_gbs": busbw_gbs(op, n, size, t)}
               for size, t in timings]
    return {"op": op, "group": group, "group_kind": group_kind, "ranks": ranks,
            "hosts": hosts, "n": n, "bus_factor": bus_factor(op, n),
            "latency_us": results[0]["time_us"] if results else None, "results": results}


GROUP_KINDS = ("node", "cross-node", "world")


def sorted_collectives(collectives: list[dict]) -> list[dict]:
    """Node groups first, then cross-node groups, then all ranks; each group's
    collectives in COLLECTIVES order."""
    def key(c):
        kind = GROUP_KINDS.index(c["group_kind"]) if c["group_kind"] in GROUP_KINDS else 9
        first = c["ranks"][0] if c["ranks"] else 0
        return kind, first, COLLECTIVES.index(c["op"]) if c["op"] in COLLECTIVES else 9
    return sorted(collectives, key=key)


def write_profile(profile: dict, out_dir: Path) -> Path:
    path = Path(out_dir) / PROFILE_FILE
    tmp = path.with_suffix(".json.part")
    tmp.write_text(json.dumps(profile, indent=2))
    tmp.replace(path)  # a reader never sees half a profile
    return path


def load_profile(path: str | Path) -> dict:
    """A hardware profile, checked; ProbeError naming the file otherwise."""
    p = Path(path)
    if p.is_dir():
        p = p / PROFILE_FILE
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ProbeError(f"{p}: no hardware profile there; run `trainbench probe` first") \
            from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ProbeError(f"{p}: not a readable hardware profile ({err})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ProbeError(f"{p}: not a hardware profile of schema {SCHEMA}")
    for key in ("ranks", "collectives", "verdict"):
        if not isinstance(data.get(key), (list, dict)):
            raise ProbeError(f"{p}: hardware profile lacks {key!r}")
    return data
