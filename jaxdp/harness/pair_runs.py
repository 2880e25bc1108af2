"""Training runs for the trace comparisons: a jaxdp run in this process, and torch_ref runs (one
spawned world per device count running all of its configurations; world size 1 in this process).
Each run may carry a plant: an object whose `inject(framework)` is a context manager under which the run has a
deliberate bug (`tests.mutations.Plant`, passed in by the caller: this module imports no test code),
entered where the run runs, in the torch ranks too (a plant pickles by value)."""
from __future__ import annotations

import contextlib

from ..core.registry import strategies as registry
from ..core.run import data
from ..core.run.config import RunConfig
from ..core.run.hsdp_hosts import per_strategy
from ..core.traces import trace as trace_mod
from ..judge import parity


def run_jax(cfg: RunConfig, plant=None):
    from .. import train

    with _injected("jax", plant):
        return train.run(cfg, record=True, progress=False)


def _injected(framework: str, plant):
    return contextlib.nullcontext() if plant is None else plant.inject(framework)


def _torch_job(rank: int, n: int, cfg, init, plant, kind, device=None):
    from torch_ref.train import train_rank

    with _injected("torch", plant):
        if kind != "train":  # the caller's own job in every rank (e.g. what the collectives carried)
            return kind(rank, n, cfg, init)
        return train_rank(rank, n, cfg, init, True, device=device)


def _torch_jobs(rank: int, n: int, jobs: list) -> list:
    return [_torch_job(rank, n, *job) for job in jobs]


def run_torch(cfgs: list, timeout_s: float = 900.0) -> dict:
    """{item: result} for a list of items, each a RunConfig, or (RunConfig, plant or None) or (RunConfig,
    plant, kind): kind 'train' (the default) gives the torch_ref RunResult of rank 0; a picklable function
    `kind(rank, n, cfg, init)` run in every rank gives every rank's result (N > 1 only)."""
    import torch.distributed as dist

    from torch_ref import launch

    from .. import models

    inits, by_n = {}, {}
    for item in cfgs:
        cfg, mutation, kind = (*item, "train")[:3] if isinstance(item, tuple) else (item, None, "train")
        key = (cfg.model, cfg.data, cfg.seed, cfg.dtype, cfg.hidden, cfg.n_layer, cfg.n_head, cfg.d_model, cfg.seq_len,
               cfg.channels, cfg.n_kv_head, cfg.d_ff)
        if key not in inits:
            inits[key] = models.initial_arrays(cfg, data.load(cfg.data, cfg.seed, cfg.seq_len))
        by_n.setdefault(cfg.devices, []).append((item, (cfg, inits[key], mutation, kind)))
    results = {}
    for n, entries in sorted(by_n.items()):
        jobs = [job for _, job in entries]
        if n == 1:  # in this process: on the GPU (nccl) where cfg.platform gives one, else the CPU (gloo)
            for item, job in entries:
                device = launch.rank_device(job[0].platform, 0)
                if not registry.on_one_device(job[0].strategy):
                    launch.init_process_group(device, 0, 1, 120, store=dist.HashStore())
                try:
                    results[item] = _torch_job(0, 1, *job, device=device)
                finally:
                    if dist.is_initialized():
                        dist.destroy_process_group()
        else:
            per_rank = launch.launch(_torch_jobs, n, jobs, timeout_s=timeout_s, pg_timeout_s=120)
            for i, (item, job) in enumerate(entries):
                results[item] = [r[i] for r in per_rank] if job[3] != "train" else per_rank[0][i]
    return results


def check(cfg: RunConfig, pairs, jax_runner=None, torch_runner=None) -> list:
    """Train each (label, jax strategy, torch strategy) pair on `cfg` (`parity.pairs_for`) and judge each
    jaxdp run against its torch_ref twin (`parity.compare`)."""
    jax_runner, torch_runner = jax_runner or run_jax, torch_runner or run_torch
    def side(name, framework):
        devices = 1 if registry.on_one_device(name) else cfg.devices
        return per_strategy(cfg, name).replace(devices=devices).validate(framework)

    jax_cfgs = {label: side(j, "jax") for label, j, _ in pairs}
    torch_cfgs = {label: side(t, "torch") for label, _, t in pairs}
    torch_results = torch_runner(list(dict.fromkeys(torch_cfgs.values())))
    rows = []
    for label, _, _ in pairs:
        j = jax_runner(jax_cfgs[label])
        t = torch_results[torch_cfgs[label]]
        rows.append(parity.compare(trace_mod.Trace(j.meta, j.arrays), trace_mod.Trace(t.meta, t.arrays),
                                   jax_cfgs[label], label))
    return rows
