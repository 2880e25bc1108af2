"""Hardware presets of the scaling projection (`projection`, `links`): peak FLOP/s, an assumed MFU, the GPU's
memory, and the network as built (NVLink inside a node of NODE_GPUS GPUs, the node's NICs between nodes), priced
by the project's one network model (`jaxdp.analysis.network`: NCCL's ring or tree, in-node reduction first, its
latencies), each with its source."""
from __future__ import annotations

from dataclasses import dataclass

from ...analysis import network

NODE_GPUS = 8


@dataclass(frozen=True)
class Preset:
    name: str
    peak_flops: float       # FLOP/s, dense bf16
    mfu: float              # fraction of peak a training step's compute reaches (assumed)
    nvlink_bytes_s: float   # per GPU, one direction, inside a node
    ib_bytes_s: float       # one NIC, one direction, between nodes
    nics: int               # NICs per node (one per GPU)
    memory_bytes: float     # one GPU's memory (HBM)
    sources: str


H100_NVLINK_IB = Preset(
    name="H100 SXM, NVLink 4 inside 8-GPU nodes, 8 x 400 Gb/s NICs per node between nodes",
    peak_flops=989e12, mfu=0.40, nvlink_bytes_s=450e9, ib_bytes_s=50e9, nics=network.NODE_NICS, memory_bytes=80e9,
    sources=("NVIDIA H100 Tensor Core GPU datasheet: 989 TFLOP/s dense BF16 (SXM), 80 GB HBM3, NVLink 900 GB/s per GPU "
             "(450 GB/s each way); NVIDIA DGX H100: 8 ConnectX-7 400 Gb/s NICs per node, one per GPU (50 GB/s each "
             "way, 400 GB/s a node). Collectives priced as NCCL runs them (jaxdp/analysis/network.py: rings over all "
             "of a node's NICs, trees, in-node reduction first, NCCL's own latencies). The 40% MFU of the compute is "
             "an assumption of the order published training runs report."),
)

PRESETS = {"h100": H100_NVLINK_IB}


def fabric(preset: Preset) -> network.Fabric:
    """The preset's network, as `network.seconds` prices it."""
    return network.Fabric(preset.nvlink_bytes_s, preset.ib_bytes_s, preset.nics)


def nodes_of(n: int) -> int:
    """Nodes n GPUs fill, NODE_GPUS to a node."""
    return max(1, -(-n // NODE_GPUS))
