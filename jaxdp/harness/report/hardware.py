"""Hardware presets of the scaling projection (`projection`, `links`): peak FLOP/s, an assumed MFU, and the
two links of a GPU cluster (NVLink inside a node of NODE_GPUS GPUs, InfiniBand between nodes), each with
its source."""
from __future__ import annotations

from dataclasses import dataclass

NODE_GPUS = 8


@dataclass(frozen=True)
class Preset:
    name: str
    peak_flops: float       # FLOP/s, dense bf16
    mfu: float              # fraction of peak a training step reaches (assumed)
    nvlink_bytes_s: float   # per GPU, one direction
    nvlink_alpha_s: float   # latency per ring hop inside a node
    ib_bytes_s: float       # per GPU, one direction, between nodes
    ib_alpha_s: float       # latency per ring hop across nodes
    memory_bytes: float     # one GPU's memory (HBM)
    sources: str


H100_NVLINK_IB = Preset(
    name="H100 SXM, NVLink 4 inside 8-GPU nodes, InfiniBand NDR between nodes",
    peak_flops=989e12, mfu=0.40, nvlink_bytes_s=450e9, nvlink_alpha_s=3e-6, ib_bytes_s=50e9, ib_alpha_s=10e-6,
    memory_bytes=80e9,
    sources=("NVIDIA H100 Tensor Core GPU datasheet: 989 TFLOP/s dense BF16 (SXM), 80 GB HBM3, NVLink 900 GB/s per GPU "
             "(450 GB/s each way); NVIDIA DGX H100: one ConnectX-7 400 Gb/s NDR InfiniBand port per GPU "
             "(50 GB/s each way). Latencies (3 us per NVLink hop, 10 us per IB hop) and the 40% MFU are "
             "assumptions of the order NCCL tests and published training runs report."),
)

PRESETS = {"h100": H100_NVLINK_IB}
