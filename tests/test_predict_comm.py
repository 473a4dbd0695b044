"""Collective-time formulas and rank placement of predict/comm.py and predict/device.py."""

import math

import pytest

from trainbench.predict import comm
from trainbench.predict.comm import Group, groups_for
from trainbench.predict.constants import Constants
from trainbench.predict.device import device_for

H100 = device_for("h100")
GB = 1e9


def test_all_gather_time_uses_nccl_tests_bus_bandwidth_factor():
    # nccl-tests PERFORMANCE.md: all-gather busbw = algbw * (n-1)/n.
    n, size = 8, 4 * GB
    t = comm.all_gather_s(size, Group(n, 1), H100)
    expected = comm.latency_s(n, H100) + size * (n - 1) / n / (H100.intra_node_busbw_gbs * GB)
    assert t == pytest.approx(expected, rel=1e-12)
    assert comm.reduce_scatter_s(size, Group(n, 1), H100) == pytest.approx(t, rel=1e-12)


def test_all_reduce_moves_twice_the_bytes_of_a_reduce_scatter():
    # nccl-tests PERFORMANCE.md: all-reduce busbw = algbw * 2(n-1)/n.
    n, size, g = 16, 2 * GB, Group(16, 1)
    bw_part = comm.all_reduce_s(size, g, H100) - comm.latency_s(n, H100)
    rs_part = comm.reduce_scatter_s(size, g, H100) - comm.latency_s(n, H100)
    assert bw_part == pytest.approx(2 * rs_part, rel=1e-12)


def test_single_rank_and_empty_collectives_cost_nothing():
    assert comm.all_gather_s(GB, Group(1, 1), H100) == 0.0
    assert comm.all_reduce_s(0.0, Group(8, 1), H100) == 0.0


def test_bus_bandwidth_inside_and_across_nvlink_domains():
    # hardware.md: ~370 GB/s NVLink ring inside a node, ~45 GB/s per NIC across nodes;
    # a ring with k members per node drives k NICs, capped by NVLink.
    assert comm.bus_bandwidth_gbs(Group(8, 1), H100) == H100.intra_node_busbw_gbs
    one_per_node = Group(4, 8)  # e.g. DP ranks behind TP4 x CP2
    assert comm.members_per_domain(one_per_node, 8) == 1
    assert comm.bus_bandwidth_gbs(one_per_node, H100) == H100.network_gbs
    two_per_node = Group(8, 4)
    assert comm.members_per_domain(two_per_node, 8) == 2
    assert comm.bus_bandwidth_gbs(two_per_node, H100) == 2 * H100.network_gbs
    whole_nodes = Group(64, 1)
    assert comm.bus_bandwidth_gbs(whole_nodes, H100) == min(H100.intra_node_busbw_gbs,
                                                            8 * H100.network_gbs)


def test_latency_grows_with_log_of_ranks_and_ring_latency_with_ranks():
    # Log-depth algorithms (tree, PAT): one hop latency per doubling.
    assert comm.latency_s(2, H100) == pytest.approx(H100.collective_latency_us * 1e-6)
    assert comm.latency_s(1024, H100) == pytest.approx(10 * H100.collective_latency_us * 1e-6)
    c = Constants(ring_hop_us=2.0)
    # NCCL ring: n-1 steps, one hop each.
    assert comm.ring_latency_s(65, H100, c) == pytest.approx(
        (H100.collective_latency_us + 64 * 2.0) * 1e-6)
    assert comm.ring_latency_s(1, H100, c) == 0.0


def test_p2p_uses_the_nic_across_nodes():
    size = 64e6
    across = comm.p2p_s(size, True, H100)
    inside = comm.p2p_s(size, False, H100)
    assert across == pytest.approx(H100.collective_latency_us * 1e-6 + size / (45 * GB))
    assert inside < across


def test_groups_follow_megatron_rank_order():
    # Megatron-LM orders ranks tp-cp-dp-pp, tensor parallel fastest.
    g = groups_for(tp=4, cp=2, dp=8, pp=4)
    assert (g.tp.size, g.tp.stride) == (4, 1)
    assert (g.cp.size, g.cp.stride) == (2, 4)
    assert (g.dp.size, g.dp.stride) == (8, 8)
    assert (g.dp_cp.size, g.dp_cp.stride) == (16, 4)
    assert (g.pp.size, g.pp.stride) == (4, 64)
    assert g.fsdp.size == 16 and g.replicas.size == 1
    hsdp = groups_for(tp=1, cp=1, dp=512, pp=1, dp_shard=128)
    assert (hsdp.fsdp.size, hsdp.replicas.size, hsdp.replicas.stride) == (128, 4, 128)
    assert comm.crosses_domains(g.pp, 8) and not comm.crosses_domains(g.tp, 8)


def test_cluster_config_overrides_bandwidth():
    config = {"bandwidth": {"h100": {"network_gbs": 90, "collective_latency_us": 5}}}
    dev = device_for("h100", config=config)
    assert dev.network_gbs == 90.0 and dev.collective_latency_us == 5.0
    assert dev.intra_node_busbw_gbs == H100.intra_node_busbw_gbs
    with pytest.raises(ValueError, match="unknown field"):
        device_for("h100", config={"bandwidth": {"h100": {"warp_speed": 1}}})
    with pytest.raises(ValueError, match="positive"):
        device_for("h100", config={"bandwidth": {"h100": {"network_gbs": -1}}})


def test_unknown_devices_never_borrow_figures():
    with pytest.raises(LookupError):
        device_for("cpu")
    with pytest.raises(LookupError):
        device_for("tpu9")
    assert math.isclose(H100.peak("fp32"), H100.peak("bf16"))
    a100 = device_for("a100")
    with pytest.raises(LookupError, match="fp8"):
        a100.peak("fp8")
