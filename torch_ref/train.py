"""The torch training loop, top to bottom: data -> model (JAX's initial bits) -> `parallelize` ->
`train_step`s -> `Recorder` (the library API, `torch_ref/api.py`: the CLI has no other path). `run`
is the entry point: one process (`single`, or any strategy with --devices 1), N spawned ranks
(`--devices N`), or one rank of a world that torchrun started.
"""
from __future__ import annotations

import math
import time
import warnings
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from jaxdp.core.files import ckpt_folder
from jaxdp.core.process import progress as run_progress  # where the run is, for the line Ctrl-C prints
from jaxdp.core.process import stop
from jaxdp.core.registry import strategies as registry
from jaxdp.core.run import data
from jaxdp.core.run.config import ConfigError, RunConfig
from jaxdp.core.run.results import NonFiniteLoss, RunResult  # one error type and one result for both frameworks

from . import api, checkpoint, kernels, launch, models, optim, stop_agreement, strategies
from .models import cnn
from .strategies import finite
from .trace import Recorder

# FSDP2 (torch 2.13) warns when a wrapped module returns a view, as nn.Linear and LayerNorm on a 3-D input do: an
# in-place op on that output would skip the pre-backward hook. torch_ref's own models and loss never change an output
# in place (their gradients equal single's: the parity suite), so their runs here go without it; a model a user gives
# `torch_ref.parallelize` keeps the warning.
VIEW_WARNING = r"FSDP2-wrapped module .* returned a view tensor"


def versions() -> dict:
    return {"torch": torch.__version__, "numpy": np.__version__}


def cross_entropy(outputs, y):
    """The CLI's loss: mean softmax cross-entropy over every row (and position), taken in fp32 from
    bf16 logits."""
    logits = outputs.float() if outputs.dtype == torch.bfloat16 else outputs
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def configured(module: torch.nn.Module, cfg: RunConfig):
    """`module` parallelized as `cfg` says: (model, optimizer) for `torch_ref.train_step`, through the library's
    own arguments (--kernels, --dtype bfloat16 as compute_dtype, --compile)."""
    reduction = {"reduction": "canonical", "shards": cfg.shards or None} if cfg.reduction == "canonical" else {}
    return api.parallelize(module, strategy=cfg.strategy, optimizer=optim.factory(cfg), accum=cfg.accum,
                           kernels=cfg.kernels, compute_dtype=torch.bfloat16 if cfg.dtype == "bfloat16" else None,
                           compile=cfg.compile, **reduction, **strategies.options_of(cfg))


class Parallel(NamedTuple):
    """The CLI's configuration as one handle (what `torch_ref.analysis.accounting` and the tests drive), the twin
    of `jaxdp.api.Parallel`: `step(x, y)` -> {'loss': float, 'grads': {torch name: tensor} when
    return_grads}, and the strategy's (`strategies.common.Strategy`) `full_params`, `wrapped` and
    `checkpoint`."""
    name: str
    step: object
    full_params: object
    wrapped: object = None
    checkpoint: object = None


def strategy(module: torch.nn.Module, cfg: RunConfig, return_grads: bool = False) -> Parallel:
    """`cfg`'s run as one value with `step(x, y)` (accounting, mutation checks and tests drive it)."""
    model, optimizer = configured(module, cfg)
    par = api.state_of(model)
    par.return_grads = return_grads

    def step(x, y):
        loss = api.train_step(model, optimizer, x, y, cross_entropy, clip_norm=cfg.clip_norm)
        return {"loss": loss, "grads": par.grads} if return_grads else {"loss": loss}

    return Parallel(par.name, step, par.full_params, par.wrapped, par.checkpoint)


class Place(NamedTuple):
    """Where this rank runs: its rank, the world's size, its device."""
    rank: int
    world: int
    device: torch.device


def prepare(place: Place, cfg: RunConfig, init: dict[str, np.ndarray]):
    """(dataset, module, model, optimizer): the data, the model from the JAX side's initial bits on this
    rank's device, parallelized as `cfg` says, with the non-finite check on its optimizer. The twin of
    `jaxdp.train.prepare`."""
    if cfg.dtype != "bfloat16":
        launch.pin_float32(place.device)
    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    module = cnn.for_device(models.load_flax(models.build(cfg, dataset).to(place.device), init), place.device)
    model, optimizer = configured(module, cfg)
    if cfg.nan_check:  # gradients before optimizer.step(), parameters after it (strategies/finite.py)
        finite.guard(optimizer, module, strategies.resolve(cfg.strategy))
    return dataset, module, model, optimizer


def train_rank(rank: int, world: int, cfg: RunConfig, init: dict[str, np.ndarray], record: bool,
               device: torch.device | None = None) -> RunResult | None:
    """Train `cfg` as rank `rank` of `world` (the process group is up unless world is 1 and the
    strategy is `single`) through `parallelize` + `train_step` (+ a `Recorder` with `record`, whose
    arrays go into the result as jaxdp.train.run's `record`). Returns the result on rank 0, None elsewhere.
    The twin of `jaxdp.train.run`: prepare -> start -> meta and recorder -> the loop (`_train`)."""
    place = Place(rank, world, device or launch.rank_device(cfg.platform, rank))
    dataset, module, model, optimizer = prepare(place, cfg, init)
    start = _start(cfg, model)
    result = RunResult(cfg, meta=_meta(cfg, place, module, start))  # a resumed run's init/ is what it resumed from
    result.meta["kernels_detail"] = kernels.detail(api.state_of(model))  # what torch ran, read from the objects
    recorder = Recorder(None, result.meta, model) if record else None
    if recorder:
        result.meta = recorder.meta  # with what the Recorder declares (`broadcast_buffers`)
        recorder.init()  # every rank: a collective for sharded strategies
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=VIEW_WARNING, category=UserWarning)
        _train(cfg, place, dataset, model, optimizer, start, recorder, result)
    if recorder:
        result.arrays = recorder.arrays
        recorder.close(write=False)
    return result if rank == 0 else None


def _start(cfg: RunConfig, model) -> int:
    """Steps already done: 0, or those of the checkpoint restored with --resume (`run` claimed the folder)."""
    return checkpoint.restore(cfg.checkpoint_dir, api.state_of(model).checkpoint, cfg) if cfg.resume else 0


def _meta(cfg: RunConfig, place: Place, module, start: int) -> dict:
    """The run's meta: the configuration, platform, backend, versions, first step, and what ran (a -jit
    name's twin, hsdp's grid)."""
    meta = {"framework": "torch", **cfg.to_dict(), "platform": "gpu" if place.device.type == "cuda" else "cpu",
            "backend": dist.get_backend() if dist.is_initialized() else None, "versions": versions(),
            "first_step": start + 1}
    if cfg.strategy in strategies.TWINS:  # a -jit name: what ran is its twin
        meta["torch_twin"] = strategies.resolve(cfg.strategy)
    if registry.entry(cfg.strategy).grid:  # hsdp: which ranks (and hosts) form each shard group: --hsdp-hosts
        meta["hsdp_grid"] = launch.hsdp_grid(module, place.world)
    return meta


def host_batch(cfg: RunConfig, dataset, step: int):
    """Step `step`'s global batch as the step takes it: float inputs in the master dtype."""
    x, y = dataset.batch(step, cfg.batch_size)
    return (x.astype(models.numpy_master_dtype(cfg.dtype)) if np.issubdtype(x.dtype, np.floating) else x), y


def _train(cfg: RunConfig, place: Place, dataset, model, optimizer, start: int, recorder, result: RunResult) -> None:
    """Steps start+1..cfg.steps: batch -> step -> log -> trace -> checkpoint."""
    t0 = t1 = time.perf_counter()
    run_progress.step_done(start)
    agreement = stop_agreement.Agreement(place.world, place.device)
    with stop.deferred() as request:  # SIGINT and SIGTERM wait for the step's end (jaxdp.core.process.stop)
        for k in range(start + 1, cfg.steps + 1):
            t_step = time.perf_counter()
            x, y = host_batch(cfg, dataset, k)  # the global batch; this rank steps on its rows of it
            loss = _step(cfg, place, model, optimizer, (x, y), k)
            result.step_times.append(time.perf_counter() - t_step)
            if place.rank == 0 and cfg.nan_check:
                check_finite(cfg, k, loss)
            result.losses.append(loss)
            if recorder:
                recorder.step(k, loss, x, y)  # every rank: a collective for sharded strategies
            run_progress.step_done(k)
            request.armed = True  # from here a signal waits for the step's end (and a save in progress)
            saved = checkpoint.maybe_save(cfg.checkpoint_dir, k, api.state_of(model).checkpoint, cfg)
            if k == start + 1:
                t1 = time.perf_counter()
                result.first_step_s = t1 - t0
            _stop_here(cfg, model, k, saved, agreement.after_step(k))
        agreement.close()
    if cfg.steps - start > 1:
        result.steps_per_s = (cfg.steps - start - 1) / max(time.perf_counter() - t1, 1e-9)


def _stop_here(cfg: RunConfig, model, k: int, saved: bool, signum: int) -> None:
    """After step `k`, when the ranks agreed on a signal (`stop_agreement`): step `k` saved unless it just was,
    then Stopped."""
    if signum:
        if not saved:
            checkpoint.maybe_save(cfg.checkpoint_dir, k, api.state_of(model).checkpoint, cfg, force=True)
        raise stop.Stopped(signum)


def _step(cfg: RunConfig, place: Place, model, optimizer, batch: tuple, k: int) -> float:
    """One step on this rank's rows of the global `batch` (micro-batch j: the same rows as single's)."""
    rows = (data.part_rows(a, place.rank, place.world, cfg.accum) for a in batch)
    xs, ys = (torch.from_numpy(a.astype(np.int64) if a.dtype.kind in "iu" else a).to(place.device) for a in rows)
    try:
        loss = api.train_step(model, optimizer, xs, ys, cross_entropy, clip_norm=cfg.clip_norm)
    except NonFiniteLoss as e:  # a gradient or parameter: before the step is recorded or checkpointed
        raise NonFiniteLoss(f"{e} at step {k}; nothing of step {k} recorded or checkpointed "
                            f"({cfg.strategy}, lr {cfg.lr}); lower --lr, set --clip-norm, or pass --no-nan-check "
                            f"to continue anyway") from None
    if place.device.type == "cuda":
        torch.cuda.synchronize(place.device)
    return loss


def check_finite(cfg: RunConfig, k: int, loss: float) -> None:
    """Raise NonFiniteLoss (exit 3) naming step `k` when the loss is NaN or Inf (the gradients and the
    parameters are checked on the optimizer: strategies/finite.py)."""
    if not math.isfinite(loss):
        raise NonFiniteLoss(f"loss is {loss} at step {k} ({cfg.strategy}, lr {cfg.lr}); lower --lr, "
                            f"set --clip-norm, or pass --no-nan-check to continue anyway")


def run(cfg: RunConfig, trace_path=None, record: bool | None = None, timeout_s: float = 3600.0,
        pg_timeout_s: float = 300.0, *, init: dict[str, np.ndarray] | None = None,
        heartbeat_s: float = 60.0) -> RunResult | None:
    """Train `cfg` from the initial parameters `init` (Flax-named arrays: the JAX side's, so that both
    frameworks start from the same bits) and write the trace to `trace_path` (on rank 0). Returns rank
    0's result (None on other ranks under torchrun). `jaxdp.harness.torch_run.run` computes `init`."""
    if init is None:
        raise ConfigError("torch_ref.train.run needs init= (the initial parameters as Flax-named arrays, "
                          "jaxdp.models.initial_arrays(cfg, dataset)); jaxdp.harness.torch_run.run computes them")
    record = trace_path is not None if record is None else record
    env = launch.from_env()
    if env is not None:
        rank, world, local_rank = env
        if cfg.devices not in (1, world):
            raise ConfigError(f"--devices {cfg.devices} but torchrun started WORLD_SIZE={world}; "
                              f"drop --devices or pass --devices {world}")
        cfg = cfg.replace(devices=world).validate("torch")
    cfg.validate("torch")
    lock = None
    if cfg.checkpoint_dir and (env is None or env[0] == 0):  # the folder is this run's (ckpt_folder.py)
        lock = ckpt_folder.claim(cfg.checkpoint_dir, "torch", resume=cfg.resume, overwrite=cfg.overwrite_checkpoints)
    try:
        if cfg.resume:  # a clear error before any rank starts (each rank checks again as it loads)
            checkpoint.find(cfg.checkpoint_dir, cfg)
        result = _train_ranks(cfg, env, init, record, (timeout_s, pg_timeout_s, heartbeat_s))
    except KeyboardInterrupt:  # Ctrl-C: the ranks are stopped; the complete checkpoints stay, a save cut short goes
        ckpt_folder.discard_torn(cfg.checkpoint_dir if cfg.checkpoint_every > 0 else None)
        raise
    finally:
        if lock is not None:
            lock.release()
    if trace_path is not None and result is not None:
        from jaxdp.core.traces import trace

        trace.save(trace_path, result.meta, result.arrays)
        run_progress.kept(trace_path, f"trace {trace_path}")
    return result


def _train_ranks(cfg: RunConfig, env, init, record: bool, limits: tuple) -> RunResult | None:
    """`train_rank` as this rank of a torchrun world (`env`), in this process (--devices 1), or on
    `cfg.devices` spawned ranks: rank 0's result. `limits`: (run timeout, collective timeout, heartbeat) s."""
    timeout_s, pg_timeout_s, heartbeat_s = limits
    if env is not None:  # one rank of a torchrun world: every rank computed the same init
        rank, world, local_rank = env
        device = launch.rank_device(cfg.platform, local_rank)
        launch.init_process_group(device, rank, world, pg_timeout_s)
        try:
            result = train_rank(rank, world, cfg, init, record, device)
        finally:
            dist.destroy_process_group()
    elif cfg.devices == 1:  # in this process; a world of one for the distributed strategies
        device = launch.rank_device(cfg.platform, 0)
        if not registry.on_one_device(cfg.strategy):
            launch.init_process_group(device, 0, 1, pg_timeout_s, store=dist.HashStore())
        try:
            result = train_rank(0, 1, cfg, init, record, device)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    else:
        result = launch.launch(train_rank, cfg.devices, cfg, init, record, platform=cfg.platform,
                               timeout_s=timeout_s, pg_timeout_s=pg_timeout_s, heartbeat_s=heartbeat_s)[0]
    return result


def summary(result: RunResult) -> str:
    cfg = result.cfg
    twin = f" (its twin {result.meta['torch_twin']})" if "torch_twin" in result.meta else ""
    return (f"{cfg.strategy}{twin} on {cfg.devices} {result.meta.get('platform', '?')} rank(s) (torch), "
            f"{cfg.model}/{cfg.data}, {cfg.dtype}: {cfg.steps} steps, loss {result.losses[0]:.4f} -> "
            f"{result.losses[-1]:.4f}, first step {result.first_step_s:.2f}s, {result.rate()}")

