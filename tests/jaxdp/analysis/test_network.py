"""The network model (analysis/network.py): NCCL's ring over NVLink in a node and over all the node's NICs across
nodes, its tree for all-reduces over nodes, a NIC per GPU for groups of one GPU per node."""
from __future__ import annotations

import pytest

from jaxdp.analysis import network
from jaxdp.core.run import targets

H100 = network.fabric(targets.TARGETS["h100"])
GB = 1e9


def test_a_ring_in_a_node_runs_at_nvlink_and_across_nodes_at_all_the_nodes_nics():
    inside = network.seconds("all-gather", 10 * GB, 8, 1, H100)
    assert inside == pytest.approx(10 * GB / 450e9 + network.RING_BASE_S + 7 * network.RING_NVLINK_HOP_S)
    across = network.seconds("all-gather", 10 * GB, 16, 2, H100)
    assert across == pytest.approx(10 * GB / 400e9, rel=0.01)  # 8 NICs of 50 GB/s: 400, below NVLink's 450 (+95 us)
    one_nic = network.seconds("all-gather", 10 * GB, 16, 2, H100._replace(nics=1))
    assert one_nic > 7 * across  # the old model: every crossing byte through one 50 GB/s NIC


def test_a_group_of_one_gpu_per_node_has_one_nic():
    """hsdp's all-reduce across replicas: device k of each node, so one NIC each (50 GB/s), not the node's 8."""
    assert network.bus_bytes_s(2, 2, H100) == 50e9
    assert network.bus_bytes_s(16, 2, H100) == 400e9 and network.bus_bytes_s(8, 1, H100) == 450e9


def test_nccl_takes_the_tree_where_the_ring_latency_is_larger():
    small = 1e6  # 1 MB over 128 GPUs: the ring's 2 x 127 steps cost more than the tree's log2(16) network hops
    ring = network.ring_seconds("all-reduce", small, 128, 16, H100)
    tree = network.tree_seconds(small, 128, 16, H100)
    assert tree < ring and network.seconds("all-reduce", small, 128, 16, H100) == tree
    big = 10 * GB
    assert network.seconds("all-reduce", big, 16, 2, H100) == network.ring_seconds("all-reduce", big, 16, 2, H100)
    assert network.seconds("all-gather", small, 128, 16, H100) == network.ring_seconds("all-gather", small, 128, 16,
                                                                                         H100)  # a ring only


def test_nothing_to_send_costs_nothing_and_bytes_rescale_by_the_ring_share():
    assert network.seconds("all-reduce", 0.0, 8, 1, H100) == 0.0
    assert network.seconds("all-reduce", GB, 1, 1, H100) == 0.0
    assert network.rescaled(7.0, "all-gather", 8, 128) == pytest.approx(8 * 127 / 128)  # payload 8, 127/128 of it
    assert network.rescaled(5.0, "collective-permute", 8, 128) == 5.0
    assert network.seconds("collective-permute", GB, 16, 2, H100) == pytest.approx(network.RING_BASE_S + GB / 50e9)
