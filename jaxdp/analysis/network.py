"""The network of a GPU cluster as it is built, and what NCCL does on it: the seconds one collective takes.

The fabric (`Fabric`, per target; H100 figures, each sourced):
- within a node, every GPU reaches every other through NVSwitch at `nvlink_bytes_s` per direction (H100 SXM
  datasheet: NVLink 4, 900 GB/s per GPU both ways, 450 each; nccl-tests report a bus bandwidth of 460-480 GB/s
  for all-reduce on 8 H100 SXM, docs.alayanew.com "NCCL-tests in practice", 2026);
- across nodes, each node has `nics` network cards of `nic_bytes_s` (NVIDIA DGX H100: 8 ConnectX-7, 400 Gb/s
  = 50 GB/s each, one per GPU: a rail-optimised fabric; nccl-tests report 400-450 GB/s all-reduce bus bandwidth
  on H100 nodes over NDR, saturncloud.io "Validating multi-node GPU clusters with NCCL tests").
NCCL's algorithms (`seconds`), with the latencies of NCCL's own tuning model (NVIDIA/nccl src/graph/tuning.cc,
`ncclTopoTuneModel`, the 2.x version with LL128; the Simple protocol of large messages): a ring over the group's
devices, laid out node by node (the in-node hops on NVLink, one crossing per node and channel; NCCL runs one
channel per NIC, so a node's crossings use all its `nics`): a device's bytes (`bytes_per_device`: what it sends in
the ring algorithm, accounting.collectives) at the ring's bus bandwidth, min(NVLink, the group's GPUs per node x
a NIC each), plus `RING_BASE_S` and a latency per step (NVLink `RING_NVLINK_HOP_S`, a node crossing
`RING_NET_HOP_S`); for an all-reduce over several nodes NCCL's tree too (reduce in the node first, then up and
down a tree of nodes: half the bus bandwidth at 0.92 of it, latency 2 ((G-1) NVLink + log2 K network) tree
hops), whichever is faster, as NCCL chooses. A collective-permute is one point-to-point send (NVLink in a node,
one NIC across nodes).
"""
from __future__ import annotations

import math
from typing import NamedTuple

RING_BASE_S = 8.4e-6       # baseLat[Ring][Simple]
RING_NVLINK_HOP_S = 5.7e-6  # hwLat[NVLINK][Ring][Simple]
RING_NET_HOP_S = 6.6e-6     # hwLat[NET][Ring][Simple]
TREE_NVLINK_HOP_S = 28e-6   # hwLat[NVLINK][Tree][Simple]
TREE_NET_HOP_S = 50e-6      # hwLat[NET][Tree][Simple]
TREE_BUS_FACTOR = 0.92 * 0.5  # busBw * .92 for the tree, and its algorithm bandwidth is half its bus bandwidth
NODE_NICS = 8               # NVIDIA DGX H100 / HGX H100: 8 ConnectX-7 per node, one per GPU


class Fabric(NamedTuple):
    nvlink_bytes_s: float  # per GPU and direction, within a node
    nic_bytes_s: float     # one network card, per direction
    nics: int              # network cards per node


def fabric(target) -> Fabric:
    """The fabric of `target` (`core.targets.Target`): its NVLink and one NIC per GPU, NODE_NICS per node."""
    return Fabric(target.nvlink_bytes_s, target.ib_bytes_s, NODE_NICS)


def bus_bytes_s(group: int, nodes: int, f: Fabric) -> float:
    """A ring's bus bandwidth over `group` devices on `nodes` nodes: NVLink within one node; across nodes the
    slower of NVLink and the node's NICs the group's GPUs there drive (one each, at most `f.nics`)."""
    if nodes <= 1:
        return f.nvlink_bytes_s
    per_node = max(1, group // nodes)
    return min(f.nvlink_bytes_s, min(per_node, f.nics) * f.nic_bytes_s)


def ring_seconds(op: str, sent: float, group: int, nodes: int, f: Fabric) -> float:
    """NCCL's ring: bytes at the bus bandwidth, its base latency and one per step (NVLink or a crossing)."""
    twice = op == "all-reduce"
    steps = (2 if twice else 1) * (group - 1)
    inter = (2 if twice else 1) * (nodes - 1)
    latency = RING_BASE_S + (steps - inter) * RING_NVLINK_HOP_S + inter * RING_NET_HOP_S
    return latency + sent / bus_bytes_s(group, nodes, f)


def tree_seconds(sent: float, group: int, nodes: int, f: Fabric) -> float:
    """NCCL's tree all-reduce (in-node reduction first, then a tree of nodes): the payload (the ring's bytes x
    n / 2(n-1)) at TREE_BUS_FACTOR of the bus bandwidth, and its hops' latency."""
    payload = sent * group / (2 * (group - 1))
    latency = 2 * ((max(1, group // nodes) - 1) * TREE_NVLINK_HOP_S + math.log2(nodes) * TREE_NET_HOP_S)
    return latency + payload / (TREE_BUS_FACTOR * bus_bytes_s(group, nodes, f))


def seconds(op: str, sent: float, group: int, nodes: int, f: Fabric) -> float:
    """One run of a collective `op` over a group of `group` devices spanning `nodes` nodes, `sent` the bytes one
    device sends in it (ring-counted), on fabric `f`; the algorithm NCCL would pick (the faster)."""
    if group <= 1 or sent <= 0:
        return 0.0
    if op == "collective-permute":
        return RING_BASE_S + sent / (f.nvlink_bytes_s if nodes <= 1 else f.nic_bytes_s)
    ring = ring_seconds(op, sent, group, nodes, f)
    if op == "all-reduce" and nodes > 1:
        return min(ring, tree_seconds(sent, group, nodes, f))
    return ring


def rescaled(sent: float, op: str, n_from: int, n_to: int) -> float:
    """Ring bytes per device of a collective measured over `n_from` devices, over `n_to` instead (the payload
    fixed: (n-1)/n of it per phase; a permute's bytes unchanged)."""
    if op == "collective-permute" or n_from <= 1:
        return sent
    return sent * (n_to - 1) / n_to * n_from / (n_from - 1)
