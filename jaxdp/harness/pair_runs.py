"""Training runs for the trace comparisons: a jaxdp run in this process, and torch_ref runs (one
spawned world per device count running all of its configurations; world size 1 in this process).
Each run may carry a mutation (a deliberate bug, `jaxdp.harness.mutations`), injected where it runs."""
from __future__ import annotations

import contextlib

from ..core.registry import strategies as registry
from ..core.run import data
from ..core.run.config import RunConfig


def run_jax(cfg: RunConfig, mutation: str | None = None):
    from .. import train

    with _injected("jax", mutation):
        return train.run(cfg, record=True, progress=False)


def _injected(framework: str, mutation: str | None):
    if mutation is None:
        return contextlib.nullcontext()
    from . import mutations

    return mutations.inject(framework, mutation)


def _torch_job(rank: int, n: int, cfg, init, mutation, kind: str, device=None):
    from torch_ref.train import train_rank

    with _injected("torch", mutation):
        if kind == "dtypes":
            from .mutations.torch_bugs import collective_dtypes

            return collective_dtypes(rank, n, cfg, init)
        return train_rank(rank, n, cfg, init, True, device=device)


def _torch_jobs(rank: int, n: int, jobs: list) -> list:
    return [_torch_job(rank, n, *job) for job in jobs]


def run_torch(cfgs: list, timeout_s: float = 900.0) -> dict:
    """{item: result} for a list of items, each a RunConfig, or (RunConfig, mutation name or None)
    or (RunConfig, mutation, kind): kind 'train' (the default) gives the torch_ref RunResult of
    rank 0, 'dtypes' every rank's `mutations.torch_bugs.collective_dtypes` (N > 1 only)."""
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
                results[item] = [r[i] for r in per_rank] if job[3] == "dtypes" else per_rank[0][i]
    return results
