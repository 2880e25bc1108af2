"""The torch training loop, top to bottom: data -> model (JAX's initial bits) -> strategy -> steps ->
trace. `run` is the entry point: one process (`single`, or any strategy with --devices 1), N
spawned ranks (`--devices N`), or one rank of a world that torchrun started.
"""
from __future__ import annotations

import math
import os
import time

import numpy as np
import torch
import torch.distributed as dist

from jaxdp import data
from jaxdp.config import ConfigError, RunConfig
from jaxdp.train import NonFiniteLoss, RunResult  # one error type and one result for both frameworks

from . import checkpoint, launch, models, strategies

FAIL_ENV = "TORCH_REF_FAIL_AT"  # "RANK:STEP": that rank raises at that step (tests the failure path)


class InjectedFailure(RuntimeError):
    """Raised on purpose by the TORCH_REF_FAIL_AT hook."""


def versions() -> dict:
    return {"torch": torch.__version__, "numpy": np.__version__}


def train_rank(rank: int, world: int, cfg: RunConfig, init: dict[str, np.ndarray], record: bool,
               device: torch.device | None = None) -> RunResult | None:
    """Train `cfg` as rank `rank` of `world` (the process group is up unless world is 1 and the
    strategy is `single`); with `record`, the trace's arrays go into the result (as jaxdp.train.run's
    `record`). Returns the result on rank 0, None elsewhere."""
    device = device or launch.rank_device(cfg.platform, rank)
    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    model = models.load_flax(models.build(cfg, dataset).to(device), init)
    names = models.flax_names(model)
    result = RunResult(cfg)
    result.meta = {"framework": "torch", **cfg.to_dict(), "platform": "gpu" if device.type == "cuda" else "cpu",
                   "backend": dist.get_backend() if dist.is_initialized() else None, "versions": versions()}
    if record and not cfg.resume:
        result.arrays.update({f"init/{k}": v for k, v in models.to_flax(dict(model.named_parameters()), names).items()})
    strategy = strategies.make(cfg.strategy, model, cfg, return_grads=record)  # the trace holds the grads
    start = 0
    if cfg.resume:  # every rank loads its part; a resumed run's init/ is what it resumed from
        start = checkpoint.restore(cfg.checkpoint_dir, strategy.checkpoint, cfg)
        if record:
            params = strategy.full_params()  # a collective for sharded strategies
            if rank == 0:
                result.arrays.update({f"init/{k}": v for k, v in models.to_flax(params, names).items()})
    result.meta["first_step"] = start + 1
    input_dtype = models.numpy_master_dtype(cfg.dtype)
    rows = slice(rank * cfg.batch_size // world, (rank + 1) * cfg.batch_size // world)
    fail_at = _fail_at()

    t0 = t1 = time.perf_counter()
    for k in range(start + 1, cfg.steps + 1):
        t_step = time.perf_counter()
        x, y = dataset.batch(k, cfg.batch_size)
        floating = np.issubdtype(x.dtype, np.floating)
        if floating:
            x = x.astype(input_dtype)
        if fail_at == (rank, k):
            raise InjectedFailure(f"injected failure on rank {rank} at step {k} ({FAIL_ENV})")
        xs = torch.from_numpy(x[rows] if floating else x[rows].astype(np.int64)).to(device)
        ys = torch.from_numpy(y[rows].astype(np.int64)).to(device)
        out = strategy.step(xs, ys)
        loss = float(out["loss"]) if rank == 0 else math.nan
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        result.step_times.append(time.perf_counter() - t_step)
        if rank == 0 and cfg.nan_check and not math.isfinite(loss):
            raise NonFiniteLoss(f"loss is {loss} at step {k} ({cfg.strategy}, lr {cfg.lr}); lower --lr, "
                                f"set --clip-norm, or pass --no-nan-check to continue anyway")
        result.losses.append(loss)
        if record:
            params = strategy.full_params()  # every rank: a collective for sharded strategies
            if rank == 0:
                _record(result.arrays, k, loss, x, y, out["grads"], params, names)
        if cfg.checkpoint_every > 0 and k % cfg.checkpoint_every == 0:
            checkpoint.save(cfg.checkpoint_dir, k, strategy.checkpoint, cfg)
        if k == start + 1:
            t1 = time.perf_counter()
            result.first_step_s = t1 - t0
    if cfg.steps - start > 1:
        result.steps_per_s = (cfg.steps - start - 1) / max(time.perf_counter() - t1, 1e-9)
    return result if rank == 0 else None


def run(cfg: RunConfig, trace_path=None, record: bool | None = None, timeout_s: float = 3600.0,
        pg_timeout_s: float = 300.0) -> RunResult | None:
    """Train `cfg` and write the trace to `trace_path` (on rank 0). Returns rank 0's result (None on
    other ranks under torchrun)."""
    record = trace_path is not None if record is None else record
    env = launch.from_env()
    if env is not None:
        rank, world, local_rank = env
        if cfg.devices not in (1, world):
            raise ConfigError(f"--devices {cfg.devices} but torchrun started WORLD_SIZE={world}; "
                              f"drop --devices or pass --devices {world}")
        cfg = cfg.replace(devices=world).validate("torch")
    cfg.validate("torch")
    if cfg.resume:  # a clear error before any rank starts (each rank checks again as it loads)
        checkpoint.find(cfg.checkpoint_dir, cfg)
    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    init = models.jax_init(cfg, dataset)  # the JAX side's initial parameters, the one source

    if env is not None:  # one rank of a torchrun world: every rank computed the same init
        device = launch.rank_device(cfg.platform, local_rank)
        launch.init_process_group(device, rank, world, pg_timeout_s)
        try:
            result = train_rank(rank, world, cfg, init, record, device)
        finally:
            dist.destroy_process_group()
    elif cfg.devices == 1:  # in this process; a world of one for the distributed strategies
        device = launch.rank_device(cfg.platform, 0)
        if cfg.strategy != "single":
            launch.init_process_group(device, 0, 1, pg_timeout_s, store=dist.HashStore())
        try:
            result = train_rank(0, 1, cfg, init, record, device)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    else:
        result = launch.launch(train_rank, cfg.devices, cfg, init, record, platform=cfg.platform,
                               timeout_s=timeout_s, pg_timeout_s=pg_timeout_s)[0]
    if trace_path is not None and result is not None:
        from jaxdp import trace

        trace.save(trace_path, result.meta, result.arrays)
    return result


def summary(result: RunResult) -> str:
    cfg = result.cfg
    return (f"{cfg.strategy} on {cfg.devices} {result.meta.get('platform', '?')} rank(s) (torch), "
            f"{cfg.model}/{cfg.data}, {cfg.dtype}: {cfg.steps} steps, loss {result.losses[0]:.4f} -> "
            f"{result.losses[-1]:.4f}, first step {result.first_step_s:.2f}s, {result.steps_per_s:.1f} steps/s after")


def _fail_at() -> tuple[int, int] | None:
    spec = os.environ.get(FAIL_ENV)
    if not spec:
        return None
    rank, step = spec.split(":")
    return int(rank), int(step)


def _record(arrays, k, loss, x, y, grads, params, names):
    arrays[f"step/{k}/loss"] = np.asarray(loss, dtype=np.float64)
    arrays[f"step/{k}/x"] = np.asarray(x)
    arrays[f"step/{k}/y"] = np.asarray(y)
    for name, g in models.to_flax(grads, names).items():
        arrays[f"step/{k}/grad/{name}"] = g
    for name, p in models.to_flax(params, names).items():
        arrays[f"step/{k}/param/{name}"] = p
