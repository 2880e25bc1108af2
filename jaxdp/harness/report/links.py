"""The projection's two-level link model: NVLink inside a node of NODE_GPUS GPUs, InfiniBand between
nodes, and hsdp (S = the node size) against 1-D zero3 and ddp on the reference models.

Each collective is a ring over the devices it spans, timed on the slowest link it crosses
(`hardware.Preset`: NVLink 450 GB/s and 3 us per hop per GPU inside a node; InfiniBand NDR 50 GB/s and
10 us per hop per GPU between nodes; the sources are the preset's):
- a 1-D strategy's ring spans all N GPUs: NVLink while N <= NODE_GPUS, InfiniBand past one node (a
  ring through every GPU of several nodes crosses the inter-node links at the speed of the slowest);
- hsdp with S = NODE_GPUS (a shard group is a node, `--hsdp-hosts shard`): its all-gathers and
  reduce-scatter span S GPUs of one node (NVLink); the all-reduce of the gradient shard (Psi / S) spans
  the R = N / S groups (InfiniBand), one GPU per node in each ring;
- a phase of a ring over n GPUs sends (n-1)/n of its payload per GPU in n-1 hops: t = hops alpha + bytes /
  beta; ddp: an all-reduce of the gradients (2 phases); zero3 / hsdp's group: two all-gathers of the
  parameters (forward, backward) and a reduce-scatter of the gradients (3 phases); hsdp across: an
  all-reduce (2 phases) of Psi / S.

`table` (the report's "links" section, docs/COMPARE.md) uses mixed precision as FSDP2 trains these models
(`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`, TorchTitan's default): gathers of 2-byte
parameters, reductions of 4-byte gradients (ddp: a 4-byte all-reduce). Weak scaling, one sequence per GPU
(projection.py); two bounds: no overlap (t_c + t_m, the projection's) and full overlap (max(t_c, t_m)).
`PUBLISHED` holds the measured scaling points it is set beside.
"""
from __future__ import annotations

from . import references
from .hardware import H100_NVLINK_IB, NODE_GPUS, Preset

GATHER_BYTES, REDUCE_BYTES = 2, 4
STRATEGIES = ("ddp", "zero3", "hsdp")


def link(n: int, preset: Preset, inside_node: bool) -> tuple[float, float]:
    """(bytes/s, seconds per hop) of a ring over n GPUs: NVLink when it stays inside a node."""
    if inside_node and n <= NODE_GPUS:
        return preset.nvlink_bytes_s, preset.nvlink_alpha_s
    return preset.ib_bytes_s, preset.ib_alpha_s


def ring(payloads: list[float], n: int, preset: Preset, inside_node: bool = True) -> float:
    """Seconds for ring phases over n GPUs, one per payload (bytes each GPU holds whole)."""
    if n <= 1:
        return 0.0
    beta, alpha = link(n, preset, inside_node)
    return sum((n - 1) * alpha + p * (n - 1) / n / beta for p in payloads)


def comm_seconds(strategy: str, params: int, n: int, preset: Preset = H100_NVLINK_IB,
                 node: int = NODE_GPUS, itemsizes=(GATHER_BYTES, REDUCE_BYTES)) -> float:
    """One step's communication of `strategy` on n GPUs (module docstring); `itemsizes`: the bytes of a
    gathered parameter and of a reduced gradient element."""
    gather, reduce = params * itemsizes[0], params * itemsizes[1]
    if strategy == "ddp":
        return ring([reduce, reduce], n, preset)
    if strategy == "zero3":
        return ring([gather, gather, reduce], n, preset)
    s = min(n, node)
    return ring([gather, gather, reduce], s, preset) + ring([reduce / s, reduce / s], n // s, preset, False)


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
             "throughput kept from 8 to 128 H100s", "kept": 0.97, "model": "Llama 3 8B", "strategy": "zero3",
     "from_n": 8, "to_n": 128, "seqs": 2,
     "source": "torchtitan docs/performance.md and Liang et al. 2024 (arXiv:2410.06511): 5,762 tokens/s/GPU on 8 "
               "H100s (Table 1: FSDP, selective activation checkpointing), ~97% of it kept on 128 (as quoted in "
               "issue 27; their hosts: 8 H100s on NVLink, 400 Gb/s RDMA per GPU between hosts, as our preset)"},
    {"what": "MaxText (FSDP), Llama2-7B, per-GPU throughput kept from 1 to 16 nodes of 8 H100s", "kept": 0.76,
     "model": "Llama 3 8B", "strategy": "zero3", "from_n": 8, "to_n": 128, "seqs": 1,
     "source": "MaxText's published Llama2-7B GPU scaling, ~76% as quoted in issue 27 (not re-read here); the "
               "Llama 3 8B shape stands in for Llama2-7B"},
)


def published(preset=H100_NVLINK_IB) -> list[dict]:
    """Each published point beside the projection's: throughput per GPU kept = E(to_n) / E(from_n),
    for the strategy it used and for hsdp, under both bounds."""
    model = next(m for m in references.REFERENCES if m.name == "Llama 3 8B")
    out = []
    for p in PUBLISHED:
        kept = {}
        for s in (p["strategy"], "hsdp"):
            a, b = row(model, s, p["from_n"], preset, p["seqs"]), row(model, s, p["to_n"], preset, p["seqs"])
            kept[s] = {k: b[k] / a[k] for k in ("weak_efficiency", "overlapped_efficiency")}
        out.append({**p, "projected": kept})
    return out
