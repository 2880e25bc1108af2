"""XLA_FLAGS across processes: what a child jaxdp process inherits.

A process that starts jaxdp processes (the `--processes` launcher, a user's script) passes its
XLA_FLAGS on, so a flag the user set (a dump folder, a scheduler or compiler setting) reaches every
worker, except the flags each process sets for itself: its simulated device count, and canonical's
XLA:CPU without fused multiply-adds (`NO_FMA`), which a canonical worker asks for and a native one
must not have.
"""
from __future__ import annotations

from collections.abc import Mapping

ENV = "XLA_FLAGS"
NO_FMA = "--xla_cpu_max_isa=AVX"  # XLA:CPU emits no fused multiply-add: reduction="canonical" needs it
DEVICE_COUNT = "--xla_force_host_platform_device_count="
PER_PROCESS = (NO_FMA, DEVICE_COUNT)  # set by each process for itself, never inherited


def without_per_process(flags: str) -> str:
    """`flags` (XLA_FLAGS' text) less the per-process flags, the others in their order."""
    return " ".join(f for f in flags.split() if not f.startswith(PER_PROCESS))


def for_child(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` for a child jaxdp process: XLA_FLAGS without the per-process flags (dropped
    when nothing else is left)."""
    out = {k: v for k, v in env.items() if k != ENV}
    kept = without_per_process(env.get(ENV, ""))
    if kept:
        out[ENV] = kept
    return out
