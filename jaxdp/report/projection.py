"""Projected scaling: an alpha-beta model of a data-parallel step on N = 8 ... 1024 GPUs.

Inputs are measured: the FLOPs of one sample's training step (XLA's cost analysis of the compiled
single-device step) and the bytes each device sends per step (read from the compiled step's HLO at
the measured device count). Hardware numbers are presets, each with its source.

Model (stated assumptions):
- compute: t_c = FLOPs per sample x samples per device / (peak FLOP/s x MFU);
- communication: every collective here is a ring; at n devices a device sends (n-1)/n of a payload
  per phase, so the payload is recovered from the measured bytes and re-scaled to N. A ring of N
  devices takes 2(N-1) latency hops; within one node (N <= 8) it runs on NVLink, beyond that the
  ring crosses InfiniBand and the slowest link sets the pace: t_m = hops x alpha + sent / beta;
- no overlap of compute and communication (an upper bound on step time);
- weak scaling (per-device batch fixed):  E_weak(N)   = T(1) / T(N);
- strong scaling (global batch fixed):    E_strong(N) = T(1) / (N T(N)).
The seed notes write these two with the labels swapped (weak = T1 / (N TN)); we use the standard
definitions, which match the seeds' formulas if T is read as the time of the whole run.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

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
    sources: str


H100_NVLINK_IB = Preset(
    name="H100 SXM, NVLink 4 inside 8-GPU nodes, InfiniBand NDR between nodes",
    peak_flops=989e12, mfu=0.40, nvlink_bytes_s=450e9, nvlink_alpha_s=3e-6, ib_bytes_s=50e9, ib_alpha_s=10e-6,
    sources=("NVIDIA H100 Tensor Core GPU datasheet: 989 TFLOP/s dense BF16 (SXM), NVLink 900 GB/s per GPU "
             "(450 GB/s each way); NVIDIA DGX H100: one ConnectX-7 400 Gb/s NDR InfiniBand port per GPU "
             "(50 GB/s each way). Latencies (3 us per NVLink hop, 10 us per IB hop) and the 40% MFU are "
             "assumptions of the order NCCL tests and published training runs report."),
)

PRESETS = {"h100": H100_NVLINK_IB}


def payload_bytes(sent_per_device: float, n_measured: int) -> float:
    """The ring payload behind `sent_per_device` bytes measured at n devices ((n-1)/n of it is sent)."""
    return 0.0 if n_measured <= 1 else sent_per_device * n_measured / (n_measured - 1)


def comm_time(payload: float, n: int, hops_per_payload: float, preset: Preset) -> float:
    if n <= 1 or payload <= 0:
        return 0.0
    sent = payload * (n - 1) / n
    inside = n <= NODE_GPUS
    alpha = preset.nvlink_alpha_s if inside else preset.ib_alpha_s
    beta = preset.nvlink_bytes_s if inside else preset.ib_bytes_s
    return hops_per_payload * (n - 1) * alpha + sent / beta


def project(flops_per_sample: float, sent_per_device: float, n_measured: int, samples_per_device: int,
            global_batch: int, preset: Preset = H100_NVLINK_IB, hops_per_payload: float = 2.0,
            ns=(8, 16, 32, 64, 128, 256, 512, 1024)) -> dict:
    """Step times and scaling efficiencies for each N (see the module docstring)."""
    flops_s = preset.peak_flops * preset.mfu
    payload = payload_bytes(sent_per_device, n_measured)
    t1_weak = samples_per_device * flops_per_sample / flops_s
    t1_strong = global_batch * flops_per_sample / flops_s
    rows = []
    for n in ns:
        t_comm = comm_time(payload, n, hops_per_payload, preset)
        t_weak = t1_weak + t_comm
        t_strong = global_batch / n * flops_per_sample / flops_s + t_comm
        rows.append({"n": n, "comm_s": t_comm, "weak_step_s": t_weak, "strong_step_s": t_strong,
                     "weak_efficiency": t1_weak / t_weak, "strong_efficiency": t1_strong / (n * t_strong)})
    return {"preset": asdict(preset), "payload_bytes": payload, "flops_per_sample": flops_per_sample,
            "samples_per_device": samples_per_device, "global_batch": global_batch, "rows": rows}


def efficiencies(projection: dict, kind: str) -> tuple[np.ndarray, np.ndarray]:
    rows = projection["rows"]
    return np.array([r["n"] for r in rows]), np.array([r[f"{kind}_efficiency"] for r in rows])
