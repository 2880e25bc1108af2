"""Sizes checked before any work (docs/RELIABILITY.md, "Sizes checked before work"): a run that cannot fit
this machine is refused in one line with the figure and the fix, before JAX allocates anything or torch
starts a rank; `--force` skips the refusal for the user who knows better.

Two checks, both arithmetic: `check_count` (before the configuration's own checks, so that `--devices
100000` is answered by the cap, not by a batch size to match it) caps the simulated CPU devices and the
local processes per core; `check_fit` holds `jaxdp.core.memory.sizes.estimate` against the memory the run's
devices share (`jaxdp.core.process.machine`): the host's for simulated CPU devices and torch's CPU ranks (all
share it), each GPU's own for GPUs.
"""
from __future__ import annotations

import dataclasses
import os

from ..errors import ConfigError
from ..process import machine
from ..registry import strategies as registry
from ..run import targets, values
from . import sizes

# XLA:CPU runs every simulated device's program on the host's cores: 4096 devices took 12.8 s to start
# JAX alone on 2 cores, 100000 hung; 128 (64 per core) trained a tiny model in 20 s.
SIMULATED_PER_CORE = 64
# A rank (torch_ref) or a `--processes` process is a Python process with a framework loaded (about 220 MiB
# for torch, 200 MiB for JAX, measured) and its own threads: more than 8 per core only wait for each other.
PROCESSES_PER_CORE = 8
PROCESS_BYTES = 200 * 2**20
FORCE = "(or pass --force)"


def local_processes(cfg, framework: str, processes: int = 1) -> int:
    """Processes this command starts on this machine: torch's --devices ranks (none under torchrun, which
    starts them), `jaxdp train --processes P`'s P."""
    if framework == "torch":
        return 1 if os.environ.get("WORLD_SIZE") else cfg.devices
    return processes


def local_devices(cfg, framework: str, hosts: int = 1) -> int:
    """Devices on this machine: all --devices, or this host's share of a cluster run (torchrun: one rank's)."""
    if framework == "torch" and os.environ.get("WORLD_SIZE"):
        return 1
    return max(1, cfg.devices // hosts)


def check_count(cfg, framework: str, processes: int = 1, hosts: int = 1, force: bool = False,
                target: str | None = None) -> None:
    """Simulated CPU devices and local processes within their cap per core, or one line naming the cap
    (`target`: the devices are a GPU target's, compiled for, not simulated: no cap)."""
    values.check_ranges({"devices": cfg.devices, "replicas": cfg.replicas})  # a count, before it is divided
    if force or target:
        return
    cores, local = machine.cores(), local_devices(cfg, framework, hosts)
    if framework == "jax" and not machine.uses_gpu(cfg.platform, framework) and local > SIMULATED_PER_CORE * cores:
        cap = SIMULATED_PER_CORE * cores * hosts
        raise ConfigError(f"--devices {cfg.devices}: at most {SIMULATED_PER_CORE * cores} simulated CPU devices on "
                          f"this machine's {cores} core(s) ({SIMULATED_PER_CORE} per core); use --devices {cap} or "
                          f"fewer {FORCE}")
    ranks = local_processes(cfg, framework, processes)
    if ranks > PROCESSES_PER_CORE * cores:
        cap = PROCESSES_PER_CORE * cores
        flag, what = ("--devices", "torch_ref ranks") if framework == "torch" else ("--processes", "processes")
        raise ConfigError(f"{flag} {ranks} starts {ranks} {what} on this machine's {cores} core(s); at most {cap} "
                          f"({PROCESSES_PER_CORE} per core): use {flag} {cap} or fewer {FORCE}")


def need(cfg, framework: str, processes: int = 1, hosts: int = 1, steps: bool = True, target: str | None = None
         ) -> tuple[int, int | None, sizes.Estimate]:
    """(bytes this machine's host memory must hold, bytes each GPU must hold or None on CPU, the estimate);
    `steps` False: a command that compiles the step without running it (`inspect`) holds no activations;
    `target` (--target): each GPU is the target's, and the host holds no parameter (compiled from shapes)."""
    est = sizes.estimate(cfg)
    if not steps:
        est = dataclasses.replace(est, activations=0)
    procs = local_processes(cfg, framework, processes) * PROCESS_BYTES
    if target or machine.uses_gpu(cfg.platform, framework):
        return est.batch + procs, est.per_device, est
    return local_devices(cfg, framework, hosts) * est.per_device + est.batch + procs, None, est


def check_fit(cfgs, framework: str, processes: int = 1, hosts: int = 1, force: bool = False,
              steps: bool = True, target: str | None = None, device_check: bool = True) -> None:
    """Each run's estimate within the host's available memory (and each GPU's: the target's with `target`),
    or one line: the figure, its parts, what the machine has, and the fix (`steps`, `target`: as `need`;
    `device_check` False: the GPU's figure is reported by the command, not refused)."""
    if force:
        return
    available = machine.available_bytes()
    gpu = machine.gpu_bytes() if machine.uses_gpu(cfgs[0].platform, framework) else None
    if target:
        gpu = targets.TARGETS[target].memory_bytes
    where = (framework, processes, hosts, steps, target)
    each = f"each {target.upper()}" if target else "each GPU"
    for cfg in cfgs:
        host, device, est = need(cfg, *where)
        which = f"--strategy {cfg.strategy}: " if len(cfgs) > 1 else ""
        if device_check and device is not None and gpu is not None and device > gpu:
            raise ConfigError(f"{which}this run needs about {sizes.human(device)} per GPU ({est.parts()}); {each} "
                              f"has {sizes.human(gpu)}: {fix(cfg, where, gpu, on_gpu=True)} {FORCE}")
        if available is not None and host > available:
            raise ConfigError(f"{which}this run needs about {sizes.human(host)} ({_host_parts(cfg, where, est)}); this "
                              f"machine has {sizes.human(available)} available: {fix(cfg, where, available)} {FORCE}")


def _host_parts(cfg, where: tuple, est: sizes.Estimate) -> str:
    """'per simulated CPU device x 4: parameters 1.0 GiB, ...; on the host: the batch 2.0 MiB, 1 process 200 MiB'."""
    framework, processes, hosts = where[:3]
    n, ranks = local_devices(cfg, framework, hosts), local_processes(cfg, framework, processes)
    kind = "torch_ref rank" if framework == "torch" else "simulated CPU device"
    on_gpu = where[4] or machine.uses_gpu(cfg.platform, framework)  # --target: the parameters are on the GPUs
    per = "" if on_gpu else f"per {kind} x {n}: {est.parts()}; "
    return (per + f"on the host: the batch {sizes.human(est.batch)}, {ranks} process{'es' if ranks > 1 else ''} "
            f"{sizes.human(ranks * PROCESS_BYTES)}")


def _largest_batch(cfg, fits) -> int | None:
    """The largest --batch-size, a multiple of devices x accum, below cfg's for which `fits`; None if none."""
    per = cfg.devices * cfg.accum
    if not fits(cfg.replace(batch_size=per)):
        return None
    low, high = 1, cfg.batch_size // per  # fits(low x per), not fits(high x per)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(cfg.replace(batch_size=mid * per)) else (low, mid)
    return low * per


def fix(cfg, where: tuple, limit: int, on_gpu: bool = False) -> str:
    """What would fit in `limit` bytes: a smaller --batch-size, else a sharding strategy, else a smaller model
    (`where`: `need`'s framework, processes, hosts, steps)."""
    def fits(c) -> bool:
        host, device, _ = need(c, *where)
        return (device if on_gpu else host) <= limit

    per = cfg.devices * cfg.accum
    batch = _largest_batch(cfg, fits)
    if batch is not None:
        multiple = f" (a multiple of devices x accum = {per})" if per > 1 else ""
        return f"lower --batch-size to {batch} or less{multiple}"
    sharded = cfg.replace(strategy=registry.FULLY_SHARDED, replicas=1)
    shards_all = registry.get(cfg.strategy, "shards") == (True, True, True)
    if not shards_all and cfg.devices > 1 and fits(sharded.replace(batch_size=per)):
        smaller = "" if fits(sharded) else f" and --batch-size {_largest_batch(sharded, fits)} or less"
        return f"use --strategy zero3 (parameters, gradients and optimizer state sharded){smaller}"
    flag = {"mlp": "--hidden", "cnn": "--channels"}.get(cfg.model, "--d-model, --n-layer or --seq-len")
    return f"even --batch-size {per} does not fit; use a smaller model (lower {flag})"
