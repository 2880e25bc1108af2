"""Devices and the one-axis mesh every strategy runs on (hsdp: the same devices as a grid, `grid`).

`--devices N` means real accelerators when present, otherwise N simulated CPU devices. Simulated
devices must be requested before JAX initialises its backends (`jax_num_cpu_devices`); once JAX is
up, the count is fixed, and asking for more is an error that says how to fix it.
"""
from __future__ import annotations

import inspect
import os
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .core.process import ports, xla_flags
from .core.run.hsdp_hosts import grid_order

AXIS = "data"
REPLICA = "replica"  # hsdp's second axis: the groups (rows of the grid); `data` runs within a group


class DeviceError(RuntimeError):
    """The requested devices cannot be had; the message names the fix."""


def request_cpu_devices(n: int) -> bool:
    """Ask for at least `n` simulated CPU devices (never fewer than already asked for); False when
    JAX was already initialised (the count is then fixed)."""
    try:
        jax.config.update("jax_num_cpu_devices", max(n, jax.config.jax_num_cpu_devices))
        return True
    except RuntimeError:
        return False


NO_FMA = xla_flags.NO_FMA  # XLA:CPU emits no fused multiply-add: reduction="canonical" needs it


def no_fma_flag_set() -> bool:
    return NO_FMA in os.environ.get("XLA_FLAGS", "")


def request_no_fma() -> None:
    """Turn off XLA:CPU's fused multiply-adds for this process (before JAX starts): whether LLVM
    contracts a * b + c into one rounding depends on how a program was fused, which differs between the
    1-device and the N-device programs of the same step (measured: Adam's moments), so
    `reduction="canonical"` needs every program without them. The flag is read when JAX starts."""
    if no_fma_flag_set():
        return
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        raise DeviceError(f"reduction='canonical' needs XLA_FLAGS={NO_FMA} before JAX starts (fused multiply-adds "
                          f"differ between programs): call jaxdp.setup_devices(n, reduction='canonical') first in "
                          f"the process, or set the environment variable")
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {NO_FMA}".strip()


THREADS_ENV = "PJRT_NPROC"  # XLA:CPU's intra-op (Eigen) pool: max(this, the process's CPU devices) threads
CANONICAL_THREADS = 8  # reduction="canonical" compares N in {1, 2, 4, 8}: the pool no smaller than any of them


def fixed_threads_set() -> bool:
    """Was XLA:CPU's intra-op pool given its size (`THREADS_ENV`), as `request_fixed_threads` does?"""
    return bool(os.environ.get(THREADS_ENV))


def request_fixed_threads() -> None:
    """Give XLA:CPU's intra-op thread pool the same size in every process of this machine (before JAX
    starts): the client sizes it max(CPUs, devices), and Eigen's threaded matrix product blocks its
    inner (summed) dimension by the pool's size, so the same product in a 1-device and a 4-device
    process of a 2-CPU machine gives other bits (measured: a 512 x 512 weight gradient of 6 rows).
    `reduction="canonical"` fixes it to max(CPUs, CANONICAL_THREADS); a value already set is kept (to
    compare more devices than that, set PJRT_NPROC to the largest N in every process). Nothing is
    changed once JAX has started: the pool then exists."""
    from jax._src import xla_bridge

    if os.environ.get(THREADS_ENV) or xla_bridge.backends_are_initialized():
        return
    os.environ[THREADS_ENV] = str(max(os.cpu_count() or 1, CANONICAL_THREADS))


@dataclass(frozen=True)
class Distributed:
    """One process of a multi-process run (`jax.distributed`): where the coordinator listens, how
    many processes there are, and which one this is."""
    coordinator: str
    num_processes: int
    process_id: int

    @classmethod
    def from_env(cls) -> Distributed | None:
        """JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID, when all are set."""
        names = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
        if not all(os.environ.get(k) for k in names):
            return None
        return cls(os.environ[names[0]], int(os.environ[names[1]]), int(os.environ[names[2]]))


HEARTBEAT_TIMEOUT_S = 15  # a dead peer is noticed within this (JAX's default is 100 s)


def _initialize_distributed(n: int, platform: str, dist: Distributed) -> None:
    if n % dist.num_processes:
        raise DeviceError(f"--devices {n} does not divide over {dist.num_processes} processes")
    if not 0 <= dist.process_id < dist.num_processes:
        raise DeviceError(f"--process-id {dist.process_id} is not in [0, {dist.num_processes})")
    if platform in ("auto", "cpu"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        request_cpu_devices(n // dist.num_processes)
    jax.distributed.initialize(dist.coordinator, dist.num_processes, dist.process_id,
                               initialization_timeout=120, heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S,
                               coordinator_bind_address=ports.bind_address(dist.coordinator))  # loopback stays so
    host = dist.coordinator.rpartition(":")[0]
    if platform in ("auto", "cpu") and ports.is_loopback(host):
        gloo_on(host.strip("[]"))


def gloo_on(host: str) -> None:
    """CPU collectives (gloo) listening on `host` (a local run's loopback coordinator address) instead of the
    address this machine's hostname resolves to, which jax.distributed gives gloo by default (on many cloud
    machines the private network's address). JAX exposes no option for it: the CPU backend's factory is
    registered again, with the gloo collectives made for `host` (jaxlib's make_gloo_tcp_collectives takes it).
    Nothing is changed where the backend already started or this jaxlib lacks the call."""
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax

    make, client = getattr(_jax, "make_gloo_tcp_collectives", None), getattr(xla_bridge, "make_cpu_client", None)
    if make is None or client is None or "collectives" not in inspect.signature(client).parameters:
        return  # another jaxlib: gloo keeps JAX's default address
    if xla_bridge.backends_are_initialized() or distributed.global_state.client is None:
        return

    def cpu_backend():
        collectives = make(distributed_client=distributed.global_state.client, hostname=host)
        return client(collectives=collectives)

    xla_bridge.register_backend_factory("cpu", cpu_backend, priority=0, fail_quietly=False)


def setup(n: int, platform: str = "auto", distributed: Distributed | None = None, reduction: str = "native") -> list:
    """The first `n` devices of `platform` ('auto': the default backend, GPU when present), over all
    processes when `distributed` is given (each process then contributes n / P local devices);
    `reduction="canonical"` first turns XLA:CPU's fused multiply-adds off (`request_no_fma`) and fixes its
    intra-op thread pool's size (`request_fixed_threads`)."""
    if platform not in ("auto", "cpu", "gpu"):
        raise DeviceError(f"unknown platform {platform!r}; valid: auto, cpu, gpu")
    if reduction == "canonical":
        request_no_fma()
        request_fixed_threads()
    if distributed is not None and not jax.distributed.is_initialized():
        _initialize_distributed(n, platform, distributed)
    elif platform in ("auto", "cpu"):
        request_cpu_devices(n)
    if platform == "gpu":
        try:
            devices = jax.devices("gpu")
        except RuntimeError:
            raise DeviceError("--platform gpu: JAX sees no GPU on this machine; use --platform cpu "
                              f"to run on {n} simulated CPU devices") from None
    elif platform == "cpu":
        devices = jax.devices("cpu")
    else:
        devices = jax.devices()
    if len(devices) < n:
        kind = devices[0].platform
        if kind == "cpu":
            raise DeviceError(
                f"--devices {n}: JAX was already initialised with {len(devices)} CPU device(s). Request "
                f"simulated devices before any JAX operation: jaxdp.devices.setup({n}) first in the process, "
                f"or XLA_FLAGS=--xla_force_host_platform_device_count={n}")
        raise DeviceError(f"--devices {n} asks for more {kind.upper()}s than the {len(devices)} present; "
                          f"use --platform cpu to run on {n} simulated CPU devices")
    return list(devices[:n])


def pin_float32_matmuls(devices) -> None:
    """On a GPU, float32 matrix products in full float32 for this process: XLA:GPU's default precision
    rounds their operands to TF32 (10-bit mantissas, ~5e-4), torch's does not, so float32 parity between
    the frameworks needs 'highest' (torch_ref pins its side off too: `torch_ref.launch.pin_float32`).
    A CPU computes float32 products in float32 whatever the setting: nothing is changed there."""
    if any(d.platform == "gpu" for d in devices):
        jax.config.update("jax_default_matmul_precision", "highest")


def mesh(devices) -> Mesh:
    """A one-dimensional mesh whose only axis is named `data`."""
    return Mesh(np.asarray(devices), (AXIS,), axis_types=(AxisType.Explicit,))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def grid(mesh: Mesh, replicas: int, hosts: str = "shard") -> Mesh:
    """The devices of a one-axis mesh as hsdp's R x S grid, axes `replica` (R) and `data` (S = N / R). The
    mesh's devices are process-major (jax.devices()). `hosts` "shard": row r (a shard group, a node) is
    devices [r S, (r+1) S), a process holds whole rows; "replica": column s (a replica group) is devices
    [s R, (s+1) R), a process holds whole columns, and the axes are laid out (`data`, `replica`) so that the
    batch, split major-first (`batch_spec`), still gives device k of the flat order block k, and a process
    its own share of the rows (`core.hsdp_hosts.grid_order`)."""
    flat = np.asarray(mesh.devices).reshape(-1)
    devices = flat[np.asarray(grid_order(flat.size, replicas, hosts))]
    if hosts == "replica":
        return Mesh(devices.T, (AXIS, REPLICA), axis_types=(AxisType.Explicit,) * 2)
    return Mesh(devices, (REPLICA, AXIS), axis_types=(AxisType.Explicit,) * 2)


def grid_rows(g: Mesh) -> list[list[list[int]]]:
    """hsdp's grid as [row r (a shard group)][column s] = [device id, its process]: the trace's `hsdp_grid`."""
    rows = g.devices if g.axis_names[0] == REPLICA else g.devices.T
    return [[[int(d.id), int(d.process_index)] for d in row] for row in rows]


def batch_spec(mesh: Mesh) -> P:
    """The batch's spec: split over every axis of the mesh, the first the major one (hsdp's grid:
    replica-major, so device (r, s) holds block r S + s: device k of the flat order block k)."""
    names = mesh.axis_names
    return P(names[0] if len(names) == 1 else names)


def batch_sharded(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over the mesh: device i holds rows [i*B/N, (i+1)*B/N)."""
    return NamedSharding(mesh, batch_spec(mesh))
