"""The GPUs that `--target` compiles for (docs/GPU.md): each one's XLA target configuration, shipped as package
data (`jaxdp/assets/gpu/<name>.txtpb`, XLA's published GpuTargetConfig trimmed to what the pinned XLA parses),
and the figures the projections read: memory per GPU, peak dense bf16 FLOP/s, HBM bandwidth, and the links
model (NVLink within a node, InfiniBand across nodes, bytes per second per GPU and direction).

Arithmetic and file names only: no framework is loaded here (`jaxdp.core` is numpy-only). `require_extra`
refuses `--target` in one line when the compiler plugin (the `gpu-aot` extra) is not installed.
"""
from __future__ import annotations

import importlib.util
import os
from typing import NamedTuple

from ..errors import ConfigError

GPUS_PER_NODE = 8  # an HGX / DGX node (H100, H200, A100, B200 alike): the most GPUs one node holds
INSTALL = 'pip install -c constraints-cpu.txt -e ".[gpu-aot]"'


class Target(NamedTuple):
    """A GPU to compile for. `memory_bytes` is the target configuration's `device_memory_size` (what XLA's
    memory figures are held against); the rates are the vendor's datasheet figures for the SXM part."""
    name: str
    description: str       # the configuration's device_description_str
    memory_bytes: int
    peak_flops: float      # dense bf16 tensor-core FLOP/s
    hbm_bytes_s: float     # HBM bandwidth
    nvlink_bytes_s: float  # NVLink, per GPU and direction (within a node)
    ib_bytes_s: float      # InfiniBand, per GPU and direction (one NIC per GPU, across nodes)
    node_gpus: int = GPUS_PER_NODE  # GPUs one node holds (the NVLink domain of an HGX / DGX board)


TARGETS = {
    "h100": Target("h100", "NVIDIA H100 80GB HBM3", 84942979072, 989e12, 3.35e12, 450e9, 50e9),       # NDR 400 Gb/s
    "h200": Target("h200", "NVIDIA H200 141GB HBM3e", 151397597184, 989e12, 4.8e12, 450e9, 50e9),
    "a100": Target("a100", "NVIDIA A100-SXM4-80GB", 85100068864, 312e12, 2.039e12, 300e9, 25e9),     # HDR 200 Gb/s
    "b200": Target("b200", "NVIDIA B200", 191514411008, 2250e12, 7.67e12, 900e9, 50e9),
}


def config_path(name: str) -> str:
    """The target's XLA configuration file, inside the package."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "assets", "gpu", f"{name}.txtpb")


def config_text(name: str) -> str:
    with open(config_path(name), encoding="utf-8") as f:
        return f.read()


def extra_installed() -> bool:
    """Is JAX's CUDA plugin (the compiler the `gpu-aot` extra installs) importable? Asked, not imported."""
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ModuleNotFoundError:
        return False


def require_extra() -> None:
    """`--target` without the plugin: one line naming the extra, before any work."""
    if not extra_installed():
        raise ConfigError(f"--target compiles for a GPU with JAX's CUDA plugin, which is not installed: {INSTALL} "
                          f"(in a clone of jaxdp), or pip install 'jaxdp[gpu-aot]'")


def check(name: str, devices: int, nodes: int) -> Target:
    """The target `name` for `devices` GPUs on `nodes` nodes, or one line naming the fix."""
    if name not in TARGETS:
        raise ConfigError(f"--target {name!r}: valid: {', '.join(TARGETS)}")
    if nodes < 1 or devices < 1:
        raise ConfigError(f"--devices {devices} --nodes {nodes}: give whole numbers >= 1")
    if devices % nodes:
        raise ConfigError(f"--devices {devices} does not divide over --nodes {nodes}: give a multiple of {nodes}")
    node = TARGETS[name].node_gpus
    if devices // nodes > node:
        raise ConfigError(f"--devices {devices} on --nodes {nodes} puts {devices // nodes} GPUs on a node; a node "
                          f"of {name.upper()}s holds at most {node}: give --nodes {nodes_for(devices, node)}")
    return TARGETS[name]


def nodes_for(devices: int, node_gpus: int) -> int:
    """The fewest nodes that `devices` GPUs divide over with at most `node_gpus` on each (ceil(N / node) when it
    divides N, else the next divisor of N: 17 GPUs need 17 nodes of 1)."""
    k = -(-devices // node_gpus)
    while devices % k:
        k += 1
    return k


NOT_COMPILED = {"ddp-pmap": "jax.pmap compiles only for devices attached to this process; ddp is the same "
                            "program under shard_map: use --strategy ddp",
                "diloco": "the ahead-of-time build does not make diloco's per-replica state (outer parameters and "
                          "momentum): inspect it without --target"}


def check_run(strategies, model: str) -> None:
    """What --target cannot compile (every listed strategy checked before the first compile), in one line."""
    for name in strategies:
        if name in NOT_COMPILED:
            raise ConfigError(f"--target with --strategy {name}: {NOT_COMPILED[name]}")
    if model == "cnn":
        raise ConfigError("--target compiles the train step of a model without running statistics; the cnn's "
                          "BatchNorm runs a second program: use --model mlp, gpt, gpt2 or llama")
