"""What this machine offers a run, read without starting JAX or torch: its cores, the host memory
available now (all simulated CPU devices and all torch ranks share it), and a GPU's memory when the
run will use GPUs. `jaxdp.core.memory.fits` holds a run's estimate (`jaxdp.core.memory.sizes`) against these.

Each reader answers None when it cannot tell (no /proc/meminfo, no `nvidia-smi`): the check that
needs it is then skipped, never guessed.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess

NVIDIA_SMI_TIMEOUT_S = 5.0


def cores() -> int:
    """The cores this process may run on (its affinity, as taskset or a container limits it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """Host memory available now without swapping (the kernel's MemAvailable), or None."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def gpu_present() -> bool:
    """A GPU that CUDA can drive is on this machine (a device node): asked without loading a framework."""
    return os.path.exists("/dev/nvidiactl") or any(os.path.exists(f"/dev/nvidia{i}") for i in range(8))


def gpu_bytes() -> int | None:
    """The smallest GPU's total memory (a run's devices are alike, the smallest bounds them), from
    `nvidia-smi`, or None when it is not there or does not answer."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=True).stdout
        sizes = [int(float(v)) * 2**20 for v in out.split()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return min(sizes) if sizes else None


JAX_CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")


def uses_gpu(platform: str, framework: str = "jax") -> bool:
    """A run on `platform` ('auto', 'cpu', 'gpu') puts its devices on GPUs: 'gpu', or 'auto' with one present
    (and, for JAX, its CUDA plugin installed: without it JAX runs on simulated CPU devices)."""
    if platform != "auto":
        return platform == "gpu"
    if framework == "jax" and not any(importlib.util.find_spec(p) for p in JAX_CUDA_PLUGINS):
        return False
    return gpu_present()
