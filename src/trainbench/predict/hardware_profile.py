"""`predict --hardware PROFILE`: the GEMM and collective figures `trainbench probe` measured
on the user's machines, in place of the catalog's assumptions. Pure Python.

What a profile (hardware-profile.json, schema 1, written by trainbench.probe) replaces:

- gemm_eff_<dtype>: the large-matrix fraction of the dtype's peak. The probe times GEMMs
  at the seed workloads' MLP shapes; the model's efficiency of a GEMM of smallest side d
  is eff * d / (d + gemm_half_dim) (perf.gemm_efficiency), so the measured TFLOPS at a
  shape of smallest side d gives eff = TFLOPS / (peak * d / (d + gemm_half_dim)); the best
  shape is used, on the SLOWEST rank: a synchronous step waits for its slowest GPU. Those
  are burst timings; the probe also runs the largest shape back to back on every rank for
  seconds, and the smallest share of its burst rate a rank kept there multiplies eff (a
  Blackwell GPU at its power limit sustains ~20% below its burst, catalog.measured).
- intra_node_busbw_gbs: all-reduce bus bandwidth of the 'node' groups at the largest size
  measured (the slowest node), nccl-tests convention as the model's comm.py uses it.
- network_gbs: all-reduce bus bandwidth of the 'cross-node' groups (one local index on
  every node: each rank's own NIC), largest size, slowest group.
- collective_latency_us: the all-reduce time at the smallest size inside a node divided by
  ceil(log2 n), the model's latency per step of a log-depth collective (comm.latency_s).
- gpus_per_node / nvlink_domain: ranks per node.

- attn_eff: the large-sequence fraction of the BF16 peak causal attention reaches. The
  probe times forward + backward of the engine's SDPA kernel at Llama 3.1 8B's heads over
  one 8192-token sequence and counts its FLOPs as the model does (6 s^2 heads head_dim);
  the model's efficiency at a sequence of L tokens is attn_eff * L / (L + attn_half_len)
  (perf.attention_efficiency), so attn_eff = TFLOPS / (peak * L / (L + attn_half_len)),
  on the SLOWEST rank. Profiles from before the probe timed attention keep the catalog's.

- scan_eff: the fraction of the BF16 peak the Mamba-2 SSD scan reaches, from the slowest
  rank's timed scan (forward + backward at one TP8 rank of Nemotron-H 56B, counted as the
  model counts it), in place of the scan's derivation from its arithmetic (its matmuls and
  its kernels' traffic, constants.scan_eff).

Figures the profile lacks (fp8 on a machine without it, one node: no cross-node group)
keep the catalog's figure and say so. HBM stays the catalog's (the model's hbm_eff is
what small memory-bound kernels reach, not what one large copy reaches).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..probe.profile import shared_gpu_nodes
from .constants import (DEFAULTS, FITTED_ON, Constants, calibrated_values, constants_for,
                        transfer_constants)
from .context import MegatronRun
from .device import Device, _relabel, device_for
from .perf import predict_step

SCHEMA = 1
PROFILE_FILE = "hardware-profile.json"


class HardwareProfileError(ValueError):
    """The profile cannot be used; the message says why and how to fix it, in one line."""


@dataclass(frozen=True)
class HardwareFacts:
    path: str
    gpu_type: str
    ranks: int
    nodes: int
    gemm: dict[str, tuple[float, int, str]]
    """dtype -> (TFLOPS, smallest side of the shape, where: rank and shape)."""
    intra_node_busbw_gbs: float | None
    network_gbs: float | None
    latency_us: float | None
    attention: tuple[float, int, str] | None = None
    """(TFLOPS, sequence length, where: the rank) of the slowest rank's causal attention."""
    scan: tuple[float, str] | None = None
    """(TFLOPS, where: the rank) of the slowest rank's Mamba-2 scan."""
    sustained: dict[str, tuple[float, float, str]] = field(default_factory=dict)
    """dtype -> (share of its burst rate the GEMM kept, seconds, where: the rank) over the
    probe's sustained run, the smallest over the ranks, at most 1; absent from profiles
    written before the probe ran one."""


def _load_json(path: Path) -> dict:
    p = path / PROFILE_FILE if path.is_dir() else path
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise HardwareProfileError(f"--hardware {p}: no such file; pass the "
                                   f"{PROFILE_FILE} that `trainbench probe` wrote") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        reason = " ".join(str(err).split())
        raise HardwareProfileError(f"--hardware {p}: not a readable JSON hardware profile "
                                   f"({reason}); pass the {PROFILE_FILE} `trainbench probe` "
                                   "wrote") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise HardwareProfileError(f"--hardware {p}: schema {found!r}, expected a hardware "
                                   f"profile of schema {SCHEMA}; re-run `trainbench probe`")
    return data


def _slowest_largest(collectives: list, kind: str) -> tuple[float | None, float | None, int]:
    """(bus bandwidth at the largest size, time at the smallest size in us, group size) of
    the slowest all-reduce group of `kind`; Nones when the profile has none."""
    best: tuple[float, float | None, int] | None = None
    for c in collectives:
        if not isinstance(c, dict) or c.get("op") != "all_reduce" or c.get("group_kind") != kind:
            continue
        results = [r for r in c.get("results") or [] if isinstance(r, dict)
                   and _positive(r.get("busbw_gbs")) and _positive(r.get("size"))]
        if not results:
            continue
        last = max(results, key=lambda r: r["size"])
        first = min(results, key=lambda r: r["size"])
        small_us = first.get("time_us") if _positive(first.get("time_us")) else None
        n = int(c.get("n") or len(c.get("ranks") or []) or 2)
        if best is None or last["busbw_gbs"] < best[0]:
            best = (float(last["busbw_gbs"]), small_us, n)
    if best is None:
        return None, None, 0
    return best


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 and math.isfinite(x)


def read_facts(path: str | Path) -> HardwareFacts:
    """The figures predict uses from a profile; HardwareProfileError when it has none."""
    path = Path(path)
    data = _load_json(path)
    where = f"--hardware {path}"
    machine = data.get("machine") if isinstance(data.get("machine"), dict) else {}
    ranks = data.get("ranks")
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, dict) for r in ranks):
        raise HardwareProfileError(f"{where}: the profile lists no ranks; re-run "
                                   "`trainbench probe`")
    shared = shared_gpu_nodes(ranks)
    if shared:
        raise HardwareProfileError(f"{where}: another process used GPUs while the probe timed "
                                   f"them ({'; '.join(shared)}), so its figures are not the "
                                   "hardware's; re-run `trainbench probe` when nothing else "
                                   "runs on them")
    gemm: dict[str, tuple[float, int, str]] = {}
    for dtype in sorted({g.get("dtype") for r in ranks for g in r.get("gemm") or []
                         if isinstance(g, dict) and isinstance(g.get("dtype"), str)}):
        per_rank = []
        for r in ranks:
            rows = [g for g in r.get("gemm") or [] if isinstance(g, dict)
                    and g.get("dtype") == dtype and _positive(g.get("tflops"))
                    and all(_positive(g.get(k)) for k in ("m", "k", "n"))]
            if rows:
                top = max(rows, key=lambda g: g["tflops"])
                per_rank.append((float(top["tflops"]), int(min(top["m"], top["k"], top["n"])),
                                 f"rank {r.get('rank')}, {top.get('shape', 'GEMM')}"))
        if per_rank:
            gemm[dtype] = min(per_rank)
    sustained: dict[str, tuple[float, float, str]] = {}
    for r in ranks:
        for g in r.get("gemm_sustained") or []:
            if not (isinstance(g, dict) and isinstance(g.get("dtype"), str)
                    and _positive(g.get("tflops")) and _positive(g.get("burst_tflops"))):
                continue
            # A sustained window faster than the burst's best is timing noise: the burst
            # stands (the share never raises an efficiency).
            share = min(1.0, float(g["tflops"]) / float(g["burst_tflops"]))
            seconds = float(g["seconds"]) if _positive(g.get("seconds")) else 0.0
            if g["dtype"] not in sustained or share < sustained[g["dtype"]][0]:
                sustained[g["dtype"]] = (share, seconds, f"rank {r.get('rank')}, "
                                         f"{g.get('shape', 'GEMM')}")
    timed = [(float(a["tflops"]), int(a["seq"]), f"rank {r.get('rank')}, {a.get('name', 'attention')}")
             for r in ranks for a in [r.get("attention")]
             if isinstance(a, dict) and _positive(a.get("tflops")) and _positive(a.get("seq"))
             and a.get("dtype", "bf16") == "bf16"]
    attention = min(timed) if timed else None
    scans = [(float(a["tflops"]), f"rank {r.get('rank')}, {a.get('name', 'SSD scan')}, "
              f"{a.get('implementation', '')}".rstrip(", "))
             for r in ranks for a in [r.get("scan")]
             if isinstance(a, dict) and _positive(a.get("tflops"))
             and a.get("dtype", "bf16") == "bf16"]
    scan = min(scans) if scans else None
    collectives = data.get("collectives") if isinstance(data.get("collectives"), list) else []
    intra, small_us, n = _slowest_largest(collectives, "node")
    network, _, _ = _slowest_largest(collectives, "cross-node")
    latency = small_us / math.ceil(math.log2(n)) if small_us and n > 1 else None
    if not gemm and intra is None and network is None:
        raise HardwareProfileError(f"{where}: the profile holds no GEMM or all-reduce "
                                   "figures; re-run `trainbench probe` on the GPUs to predict")
    nodes = machine.get("nodes")
    return HardwareFacts(
        path=str(path), gpu_type=str(machine.get("gpu_type") or "").lower(),
        ranks=len(ranks), nodes=int(nodes) if _positive(nodes) else 1, gemm=gemm,
        intra_node_busbw_gbs=intra, network_gbs=network, latency_us=latency,
        attention=attention, scan=scan, sustained=sustained)


def apply_facts(facts: HardwareFacts, device: Device, constants: Constants
                ) -> tuple[Device, Constants]:
    """The device and constants with the profile's measured figures laid over them, each
    figure labelled in device.figures with the profile it came from."""
    if facts.gpu_type == "cpu":
        raise HardwareProfileError(
            f"--hardware {facts.path}: measured on a CPU; predict models GPU steps, so "
            f"probe the {device.key} machines (trainbench probe --gpu {device.key})")
    if facts.gpu_type and facts.gpu_type != device.key:
        raise HardwareProfileError(
            f"--hardware {facts.path}: measured on {facts.gpu_type or 'an unnamed device'}, "
            f"not {device.key}; predict with --gpu {facts.gpu_type} or probe the "
            f"{device.key} machines")
    src = f"measured: hardware profile {facts.path}"
    dev_values, const_values, labels = {}, {}, {}
    for dtype in ("bf16", "fp8"):
        if dtype not in facts.gemm or dtype not in device.peak_tflops:
            labels[f"gemm_eff_{dtype}"] = f"not in the profile: {_default_label(device)}"
            continue
        tflops, side, where = facts.gemm[dtype]
        if tflops > device.peak(dtype):
            raise HardwareProfileError(
                f"--hardware {facts.path}: {dtype} GEMM {tflops:.4g} TFLOPS ({where}) is above "
                f"the {device.name}'s {device.peak(dtype):g} TFLOPS peak; the profile is from "
                "another device or corrupt; re-run `trainbench probe`")
        falloff = side / (side + constants.gemm_half_dim)
        eff = tflops / (device.peak(dtype) * falloff)
        label = f"{src} ({tflops:.4g} TFLOPS, {where}"
        if dtype in facts.sustained:
            # A training step runs its GEMMs back to back for minutes: charge the share of
            # the burst rate they keep under that load.
            share, seconds, swhere = facts.sustained[dtype]
            eff *= share
            label += (f"; x {share:.3f}, the share of its burst rate kept over a "
                      f"{seconds:.3g} s sustained run, {swhere}")
        else:
            label += ("; a burst rate: the profile has no sustained run, re-run `trainbench "
                      "probe`")
        const_values[f"gemm_eff_{dtype}"] = eff
        labels[f"gemm_eff_{dtype}"] = label + ")"
    # Attention and the scan run in BF16 in every recipe: each measured rate is a share
    # of the BF16 peak, attention's with its sequence fall-off L / (L + half) divided out.
    kernels = {"attn_eff": None, "scan_eff": None}
    if facts.attention is not None:
        tflops, seq, where = facts.attention
        kernels["attn_eff"] = ("causal attention", tflops, f"at seq {seq}, {where}",
                               seq / (seq + constants.attn_half_len))
    if facts.scan is not None:
        tflops, where = facts.scan
        kernels["scan_eff"] = ("Mamba-2 scan", tflops, where, 1.0)
    bf16_peak = device.peak("bf16")
    for name, measured in kernels.items():
        if measured is None:
            labels[name] = "not in the profile: " + dict(device.figures).get(
                name, "catalog constants")
            continue
        what, tflops, where, falloff = measured
        if tflops > bf16_peak:
            raise HardwareProfileError(
                f"--hardware {facts.path}: {what} {tflops:.4g} TFLOPS ({where}) is above the "
                f"{device.name}'s {bf16_peak:g} TFLOPS BF16 peak; the profile is from another "
                "device or corrupt; re-run `trainbench probe`")
        const_values[name] = tflops / (bf16_peak * falloff)
        labels[name] = f"{src} ({tflops:.4g} TFLOPS {what}, {where})"
    for name, value in (("intra_node_busbw_gbs", facts.intra_node_busbw_gbs),
                        ("network_gbs", facts.network_gbs),
                        ("collective_latency_us", facts.latency_us)):
        if value is None:
            labels[name] = "not in the profile: " + dict(device.figures).get(name, "catalog")
        else:
            dev_values[name] = float(value)
            labels[name] = src
    if facts.ranks % facts.nodes == 0 and facts.ranks // facts.nodes > 1:
        per_node = facts.ranks // facts.nodes
        # An NVLink domain wider than a node (GB200 NVL72) is the rack's, not the probe's.
        wide = device.nvlink_domain > device.gpus_per_node
        dev_values.update(gpus_per_node=per_node,
                          nvlink_domain=device.nvlink_domain if wide else per_node)
    dev = replace(device, **dev_values, figures=_relabel(device.figures, labels))
    return dev, replace(constants, **const_values)


def _default_label(device: Device) -> str:
    return dict(device.figures).get("gemm_eff_bf16", "catalog constants")


def efficiency_labels(gpu_type: str, calibrated: dict) -> dict[str, str]:
    """Where the GEMM and attention efficiencies come from without a profile: the
    cluster config's calibration, the H100 fit, or that fit carried by measured figures."""
    names = ("gemm_eff_bf16", "gemm_eff_fp8", "attn_eff")
    if gpu_type == FITTED_ON:
        out = {n: "fitted to the seeds' H100 step times (bench/predict_accuracy.py)"
               for n in names}
    else:
        out = transfer_constants(DEFAULTS.get(gpu_type, DEFAULTS[FITTED_ON]), gpu_type)[1]
    # The scan is derived from its arithmetic on every GPU type (constants.scan_eff): say
    # how wherever it is used, and what measures it instead.
    out["scan_eff"] = ("derived: the SSD kernels' matmuls at the GEMM fall-off of the head "
                       "dim and their HBM traffic (predict/work.py ssd_scan_bytes, counted "
                       "from mamba_ssm's kernels), no constant fitted; `trainbench probe` "
                       "times the scan itself, pass --hardware to use it")
    out.update({n: "calibrated: cluster config 'calibration'" for n in (*names, "scan_eff")
                if n in calibrated})
    return out


def device_and_constants(gpu_type: str, gpus_per_node: int | None, facts: HardwareFacts | None,
                         config: dict | None = None) -> tuple[Device, Constants]:
    """The device (its figures labelled with their sources) and constants predict uses for
    a GPU type: the profile's measured figures over the catalog's when `facts` is given."""
    device = device_for(gpu_type, gpus_per_node, config)
    constants = constants_for(gpu_type, config)
    figures = dict(device.figures)
    figures.update(efficiency_labels(device.key, calibrated_values(config or {}, gpu_type)))
    device = replace(device, figures=tuple(figures.items()))
    if facts is not None:
        device, constants = apply_facts(facts, device, constants)
    return device, constants


def predict_with_profile(plan, facts: HardwareFacts | None, *, sharding: str = "engine",
                         config: dict | None = None, megatron: MegatronRun = MegatronRun()):
    """(prediction, {figure: where it came from}) for a plan, with the profile's figures
    when `facts` is given, the catalog's (measured where catalog.measured has them)
    otherwise."""
    device, constants = device_and_constants(plan.gpu_type, plan.gpus_per_node, facts, config)
    pred = predict_step(plan, sharding=sharding, config=config, constants=constants,
                        device=device, megatron=megatron)
    return pred, dict(device.figures)
