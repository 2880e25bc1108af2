"""The projection's two-level network: NVLink inside a node of NODE_GPUS GPUs, the node's NICs between nodes,
and hsdp (S = the node size) against 1-D zero3 and ddp on the reference models.

Each collective is priced by the project's one network model (`jaxdp.analysis.network.seconds`, on the preset's
fabric, `hardware.fabric`): NCCL's ring over the devices it spans, laid out node by node, whose bus bandwidth is
NVLink's (450 GB/s) inside a node and across nodes the slower of NVLink and the NICs the group's GPUs in a node
drive (one channel per NIC: a 1-D ring over whole nodes crosses on all 8 NICs of each, 400 GB/s); for an
all-reduce across nodes NCCL's tree too (in-node reduction first), whichever is faster; NCCL's latencies:
- a 1-D strategy's collectives span all N GPUs on N / NODE_GPUS nodes: ddp all-reduces the gradients, zero3
  all-gathers the parameters twice (forward, backward) and reduce-scatters the gradients;
- hsdp with S = NODE_GPUS (a shard group is a node, `--hsdp-hosts shard`): its all-gathers and reduce-scatter span
  the S GPUs of one node (NVLink); the all-reduce of the gradient shard (Psi / S) spans the R = N / S groups,
  one GPU per node in each ring, so one NIC per GPU (50 GB/s), the node's 8 rings side by side.

`table` (the report's "links" section, docs/COMPARE.md) uses mixed precision as FSDP2 trains these models
(`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`, TorchTitan's default): gathers of 2-byte
parameters, reductions of 4-byte gradients (ddp: a 4-byte all-reduce). Weak scaling, one sequence per GPU
(projection.py); two bounds: no overlap (t_c + t_m, the projection's) and full overlap (max(t_c, t_m)).
`PUBLISHED` holds the measured scaling point it is set beside.
"""
from __future__ import annotations

from ...analysis import network
from ...core.registry import strategies as registry
from . import references
from .hardware import H100_NVLINK_IB, NODE_GPUS, Preset, fabric, nodes_of

GATHER_BYTES, REDUCE_BYTES = 2, 4
FULLY_SHARDED, GRID = registry.FULLY_SHARDED, registry.names(grid=True)[0]  # zero3; hsdp (the registry's rows)
STRATEGIES = (registry.REPLICATED, FULLY_SHARDED, GRID)


def collective(op: str, payload: float, n: int, nodes: int, preset: Preset) -> float:
    """Seconds of one `op` over n GPUs on `nodes` nodes, of a payload each GPU holds whole (ring-counted bytes:
    (n-1)/n of it per phase, two phases for an all-reduce)."""
    phases = 2 if op == "all-reduce" else 1
    return network.seconds(op, phases * payload * (n - 1) / n, n, nodes, fabric(preset))


def comm_seconds(strategy: str, params: int, n: int, preset: Preset = H100_NVLINK_IB,
                 node: int = NODE_GPUS, itemsizes=(GATHER_BYTES, REDUCE_BYTES)) -> float:
    """One step's communication of `strategy` on n GPUs (module docstring); `itemsizes`: the bytes of a
    gathered parameter and of a reduced gradient element."""
    gather, reduce = params * itemsizes[0], params * itemsizes[1]
    nodes = nodes_of(n)
    if strategy == registry.REPLICATED:
        return collective("all-reduce", reduce, n, nodes, preset)
    if strategy == FULLY_SHARDED:
        return (2 * collective("all-gather", gather, n, nodes, preset)
                + collective("reduce-scatter", reduce, n, nodes, preset))
    s = min(n, node)
    inside = 2 * collective("all-gather", gather, s, 1, preset) + collective("reduce-scatter", reduce, s, 1, preset)
    return inside + collective("all-reduce", reduce / s, n // s, n // s, preset)


def row(model: references.Transformer, strategy: str, n: int, preset=H100_NVLINK_IB, seqs: int = 1) -> dict:
    """Weak-scaling step of `model` (`seqs` sequences per GPU) with `strategy` on n GPUs: both bounds."""
    compute = seqs * references.flops_per_token(model) * model.context / (preset.peak_flops * preset.mfu)
    comm = comm_seconds(strategy, references.params(model), n, preset)
    return {"model": model.name, "strategy": strategy, "n": n, "compute_s": compute, "comm_s": comm,
            "weak_efficiency": compute / (compute + comm), "overlapped_efficiency": compute / max(compute, comm)}


def table(ns=(8, 16, 128, 1024), preset=H100_NVLINK_IB) -> list[dict]:
    """Every reference model x strategy x N of `ns`."""
    return [row(m, s, n, preset) for m in references.REFERENCES for s in STRATEGIES for n in ns]


PUBLISHED = (
    {"what": "TorchTitan, FSDP2 (1-D over all GPUs), Llama 3.1 8B, bf16, local batch 2 x 8192 tokens, per-GPU "
             "throughput kept from 8 to 128 H100s", "kept": 0.973, "model": "Llama 3 8B", "strategy": FULLY_SHARDED,
     "from_n": 8, "to_n": 128, "seqs": 2,
     "source": "pytorch/torchtitan docs/performance.md, Tables 1 and 3 (FSDP, selective activation checkpointing): "
               "5,762 tokens/s/GPU on 8 H100s, 5,605 on 128 (97.3%); their hosts: 8 H100s on NVLink, 400 Gb/s "
               "per GPU between hosts, as this preset; the same point is in jaxdp/assets/calibration.json"},
)


def published(preset=H100_NVLINK_IB) -> list[dict]:
    """Each published point beside the projection's: throughput per GPU kept = E(to_n) / E(from_n),
    for the strategy it used and for hsdp, under both bounds."""
    model = next(m for m in references.REFERENCES if m.name == "Llama 3 8B")
    out = []
    for p in PUBLISHED:
        kept = {}
        for s in (p["strategy"], GRID):
            a, b = row(model, s, p["from_n"], preset, p["seqs"]), row(model, s, p["to_n"], preset, p["seqs"])
            kept[s] = {k: b[k] / a[k] for k in ("weak_efficiency", "overlapped_efficiency")}
        out.append({**p, "projected": kept})
    return out
