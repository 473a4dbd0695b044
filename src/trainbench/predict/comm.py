"""Collective communication times: latency + bytes / bus bandwidth.

Bus bandwidth as nccl-tests defines it (nccl-tests doc/PERFORMANCE.md): a collective of
S bytes over n ranks moves S*(n-1)/n bytes through each rank's slowest link for
all-gather and reduce-scatter, and 2*S*(n-1)/n for all-reduce, so
time = latency + factor * S / busbw.

Where a group's ranks sit decides the bandwidth: inside one NVLink domain the NVLink
bus bandwidth; across domains each rank's own NIC carries one ring, so a group with
k members per domain gets k NICs' worth, min(nvlink, k * network). Ranks are laid out
as Megatron-LM orders them (tensor fastest, then context, data, pipeline).
Pure Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .device import Device


@dataclass(frozen=True)
class Group:
    """A communicator: `size` ranks spaced `stride` ranks apart in the global order."""
    size: int
    stride: int

    def span(self) -> int:
        """Consecutive global ranks the group covers."""
        return (self.size - 1) * self.stride + 1


def members_per_domain(group: Group, domain: int) -> int:
    """How many of the group's ranks share one NVLink domain (at least 1)."""
    if group.span() <= domain:
        return group.size
    return max(1, domain // group.stride) if group.stride < domain else 1


def crosses_domains(group: Group, domain: int) -> bool:
    return group.span() > domain


def bus_bandwidth_gbs(group: Group, dev: Device) -> float:
    """Bus bandwidth of a ring over the group (GB/s)."""
    if not crosses_domains(group, dev.nvlink_domain):
        return dev.intra_node_busbw_gbs
    k = members_per_domain(group, dev.nvlink_domain)
    return min(dev.intra_node_busbw_gbs, k * dev.network_gbs)


def latency_s(n: int, dev: Device) -> float:
    """Start-up latency of one collective: about 10-20 us per step of a log-depth
    algorithm (tree all-reduce, NCCL PAT for all-gather / reduce-scatter at scale)."""
    if n <= 1:
        return 0.0
    return dev.collective_latency_us * 1e-6 * math.ceil(math.log2(n))


def ring_latency_s(n: int, dev: Device, constants) -> float:
    """Latency of one ring all-gather / reduce-scatter: NCCL runs them as rings, whose
    n-1 steps each pay a hop (NCCL docs, 'Algorithms'; nccl-tests small-message times)."""
    if n <= 1:
        return 0.0
    return dev.collective_latency_us * 1e-6 + (n - 1) * constants.ring_hop_us * 1e-6


def all_gather_s(size_bytes: float, group: Group, dev: Device) -> float:
    """All-gather producing `size_bytes` on every rank (nccl-tests: busbw = algbw*(n-1)/n)."""
    n = group.size
    if n <= 1 or size_bytes <= 0:
        return 0.0
    return latency_s(n, dev) + size_bytes * (n - 1) / n / (bus_bandwidth_gbs(group, dev) * 1e9)


def reduce_scatter_s(size_bytes: float, group: Group, dev: Device) -> float:
    """Reduce-scatter of a `size_bytes` input (nccl-tests: busbw = algbw*(n-1)/n)."""
    return all_gather_s(size_bytes, group, dev)


def all_reduce_s(size_bytes: float, group: Group, dev: Device) -> float:
    """All-reduce of `size_bytes` (nccl-tests: busbw = algbw*2(n-1)/n)."""
    n = group.size
    if n <= 1 or size_bytes <= 0:
        return 0.0
    return latency_s(n, dev) + 2 * size_bytes * (n - 1) / n / (
        bus_bandwidth_gbs(group, dev) * 1e9)


def p2p_s(size_bytes: float, crosses: bool, dev: Device) -> float:
    """One send/receive between neighbours: the NIC across domains, NVLink inside."""
    if size_bytes <= 0:
        return 0.0
    bw = dev.network_gbs if crosses else dev.intra_node_busbw_gbs
    return dev.collective_latency_us * 1e-6 + size_bytes / (bw * 1e9)


@dataclass(frozen=True)
class Groups:
    """The communicators of a layout, in Megatron-LM's rank order tp-cp-dp-pp."""
    tp: Group
    cp: Group
    dp: Group
    dp_cp: Group
    """Data and context ranks together: Megatron's distributed optimizer and FSDP shard
    (and reduce gradients) over it."""
    pp: Group
    fsdp: Group
    """Ranks one FSDP group shards over (dp_shard x cp; all of dp x cp without HSDP)."""
    replicas: Group
    """FSDP replicas (HSDP): gradients are all-reduced across them."""
    ep: Group = Group(1, 1)
    """Expert-parallel ranks: the token all-to-all's group."""


def groups_for(tp: int, cp: int, dp: int, pp: int, dp_shard: int = 0, ep: int = 1) -> Groups:
    shard = dp_shard if dp_shard and dp_shard < dp else dp
    # Megatron-Core's expert layout with ETP 1 (the published recipes, and trainbench's
    # engine): the expert ranks run tp fastest, so an EP group is ep neighbouring ranks.
    return Groups(
        ep=Group(ep, 1),
        tp=Group(tp, 1),
        cp=Group(cp, tp),
        dp=Group(dp, tp * cp),
        dp_cp=Group(dp * cp, tp),
        pp=Group(pp, tp * cp * dp),
        # cp is laid inside dp, so an FSDP group over dp_shard x cp is contiguous in steps of tp
        fsdp=Group(shard * cp, tp),
        replicas=Group(dp // shard, tp * cp * shard),
    )


def moe_all_to_all_bytes(tokens: float, top_k: int, hidden: int, dtype_bytes: float,
                         ep: int) -> float:
    """Bytes one rank sends in one token all-to-all (dispatch or combine) of an MoE layer.

    Each of the rank's tokens goes to top_k experts as a hidden-wide row; under balanced
    routing (the published MoE benchmarks force-balance it) a fraction (ep-1)/ep of those
    rows live on other ranks of the EP group.
    """
    if ep <= 1:
        return 0.0
    return tokens * top_k * hidden * dtype_bytes * (ep - 1) / ep


def all_to_all_s(size_bytes: float, group: Group, dev: Device) -> float:
    """One all-to-all in which each rank sends `size_bytes` spread evenly over the other
    group members: the rows for ranks in the same NVLink domain go over NVLink, the rest
    through the rank's own NIC, both at once (the slower side decides)."""
    if group.size <= 1 or size_bytes <= 0:
        return 0.0
    k = members_per_domain(group, dev.nvlink_domain)
    local = size_bytes * (k - 1) / (group.size - 1)
    remote = size_bytes - local
    t = local / (dev.intra_node_busbw_gbs * 1e9)
    if remote > 0:
        t = max(t, remote / (dev.network_gbs * 1e9))
    return latency_s(group.size, dev) + t


ALL_TO_ALL = "all_to_all"
PER_NODE = "per_node"
EP_DISPATCHES = (ALL_TO_ALL, PER_NODE)


def moe_dispatch_s(token_bytes: float, top_k: int, group: Group, dev: Device,
                   dispatch: str = ALL_TO_ALL) -> float:
    """One token dispatch (or combine) of an MoE layer over the EP group: `token_bytes` is
    one hidden-wide copy of the rank's tokens.

    'all_to_all' sends a row per chosen expert (Megatron-Core's alltoall dispatcher, the
    engine's all_to_all_single). 'per_node' is how DeepEP and HybridEP (Megatron-Core's
    flex dispatcher, which NVIDIA's MoE performance recipes run) use the network: a token
    crosses the NIC once for each other NVLink domain that holds any of its top_k experts
    and is fanned out over NVLink there. With the experts of a balanced router spread
    evenly over n domains, a token reaches (n-1)(1-(1-1/n)^top_k) other domains on
    average (sampling with replacement), against top_k(n-1)/n rows without it: 2.7 against
    6 for top-8 over four nodes."""
    if group.size <= 1 or token_bytes <= 0:
        return 0.0
    if dispatch == ALL_TO_ALL:
        # token_bytes already holds tokens x hidden x dtype bytes.
        rows = moe_all_to_all_bytes(tokens=1, top_k=top_k, hidden=token_bytes, dtype_bytes=1,
                                    ep=group.size)
        return all_to_all_s(rows, group, dev)
    if dispatch != PER_NODE:
        raise ValueError(f"unknown MoE dispatch {dispatch!r}; known: {', '.join(EP_DISPATCHES)}")
    k = members_per_domain(group, dev.nvlink_domain)
    domains = max(1, math.ceil(group.size / k))
    # Every row for another GPU crosses NVLink once (the sender's or the receiving
    # domain's fan-out); the NIC carries one copy per other domain reached.
    t = token_bytes * top_k * (group.size - 1) / group.size / (dev.intra_node_busbw_gbs * 1e9)
    if domains > 1:
        reached = (domains - 1) * (1 - (1 - 1 / domains) ** top_k)
        t = max(t, token_bytes * reached / (dev.network_gbs * 1e9))
    return latency_s(group.size, dev) + t
