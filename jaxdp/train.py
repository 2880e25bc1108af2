"""The training loop, top to bottom: devices -> data -> model -> optimizer -> strategy -> steps -> trace."""
from __future__ import annotations

import math
import signal
import sys
import time

import numpy as np

from . import devices as devices_mod
from . import precision  # the run's precision census, meta "precision"
from .core.process import progress as run_progress  # where the run is, for the line Ctrl-C prints
from .core.process import stop
from .core.registry import strategies as registry
from .core.run.config import JIT_STRATEGIES, RunConfig
from .core.run.results import NonFiniteLoss, RunResult  # noqa: F401 (re-exported: jaxdp.train's names)


def versions() -> dict:
    import flax
    import jax
    import jaxlib
    import optax

    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__,
            "optax": optax.__version__, "numpy": np.__version__, **gpu_libraries()}


def gpu_libraries() -> dict:
    """On a GPU, the CUDA runtime and cuDNN versions JAX's CUDA plugin loaded (recorded with every figure:
    `--kernels fused` runs cuDNN's attention); {} elsewhere."""
    import jax

    try:
        from jax._src.lib import cuda_versions
        if cuda_versions is None or jax.default_backend() != "gpu":
            return {}
        return {"cudnn": cuda_versions.cudnn_get_version(), "cuda_runtime": cuda_versions.cuda_runtime_get_version()}
    except (ImportError, RuntimeError, AttributeError):  # a plugin without the probe: nothing to record
        return {}


def prepare(cfg: RunConfig, return_grads: bool = False, distributed: devices_mod.Distributed | None = None):
    """Everything a run of `cfg` is built from: (devices, dataset, problem, optimizer, parallel), the
    last from `jaxdp.parallelize` (the library API: one path). Sets up the devices first (before any
    JAX computation) and makes the initial parameters on the CPU, so every platform starts from the
    same bits."""
    cfg.validate()
    devices = devices_mod.setup(cfg.devices, cfg.platform, distributed, reduction=cfg.reduction)
    import jax

    if jax.process_count() > 1 and registry.on_one_device(cfg.strategy):
        raise devices_mod.DeviceError(f"strategy {cfg.strategy!r} runs on one device of one process; drop --processes")
    if cfg.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    if cfg.dtype != "bfloat16":  # bf16 runs keep the fast matrix units; float32 ones on a GPU no TF32
        devices_mod.pin_float32_matmuls(devices)
    from . import api, models
    from .core.run import data

    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        model = models.build(cfg, dataset)
    optimizer, options = strategy_options(cfg)
    par = api.parallelize(model, None, optimizer, loss=models.cross_entropy, strategy=cfg.strategy, devices=devices,
                          accum=cfg.accum, return_grads=return_grads, kernels=cfg.kernels,
                          compute_dtype=models.fused_dtype(cfg), **options)
    return devices, dataset, par.problem, optimizer, par


def strategy_options(cfg: RunConfig) -> tuple:
    """(the optax optimizer, the strategy's options) of `cfg`: the options its strategy reads, and under
    `--reduction canonical` the clip moved from the chain into the strategy (the canonical norm)."""
    from . import optim, strategies

    optimizer = optim.for_config(cfg)
    options = {k: getattr(cfg, k) for k in strategies.OPTIONS[strategies.resolve(cfg.strategy)]}
    options["nan_check"] = cfg.nan_check  # the step's fused non-finite check (strategies/finite.py)
    if cfg.reduction == "canonical":  # the clip is the strategy's (the canonical norm), not the chain's
        optimizer = optim.make(cfg.optimizer, cfg.lr, cfg.weight_decay)
        options |= {"reduction": "canonical", "shards": cfg.shards, "clip_norm": cfg.clip_norm}
    return optimizer, options


def host_batch(cfg: RunConfig, dataset, step: int, rows: slice = slice(None)):
    """Step `step`'s batch (or its `rows`) as the step takes it: float inputs in the master dtype."""
    from .models import MASTER_DTYPE

    x, y = dataset.batch(step, cfg.batch_size, rows)
    return (x.astype(MASTER_DTYPE[cfg.dtype]) if np.issubdtype(x.dtype, np.floating) else x), y


def run(cfg: RunConfig, trace_path=None, record: bool | None = None, progress: bool | None = None,
        distributed: devices_mod.Distributed | None = None) -> RunResult:
    """Train `cfg`; record the trace when `record` (default: when `trace_path` is given).

    With `distributed`, this is one process of a multi-process run: it feeds only the rows of the
    global batch that belong to its own devices, and only process 0 writes the trace."""
    record = trace_path is not None if record is None else record
    devices, dataset, problem, optimizer, par = prepare(cfg, record, distributed)
    import jax

    from .core.traces.recorder import Recorder

    state, start, saver = _start(cfg, par, problem, optimizer)
    result = RunResult(cfg, meta={"framework": "jax", **cfg.to_dict(), "platform": devices[0].platform,
                                  "processes": jax.process_count(), "versions": versions(), "first_step": start + 1})
    if registry.entry(cfg.strategy).grid:  # hsdp: which devices (and processes) form each group: --hsdp-hosts
        result.meta["hsdp_grid"] = devices_mod.grid_rows(devices_mod.grid(devices_mod.mesh(devices), cfg.replicas,
                                                                          cfg.hsdp_hosts))
    recorder = Recorder(trace_path if jax.process_index() == 0 else None, result.meta) if record else None
    if recorder is not None:  # a resumed run's init/ is what it resumed from
        recorder.init(problem.params if start == 0 else par.params(state), state=problem.state)
        census = precision.of_run(cfg, problem, *host_batch(cfg, dataset, start + 1))  # meta "precision"
        result.meta[precision.KEY] = recorder.meta[precision.KEY] = census
    try:
        _train(cfg, dataset, par, state, start, saver, recorder, result, progress)
    except KeyboardInterrupt:  # Ctrl-C: the checkpoints stay (a save in progress completes first)
        if saver is not None:
            _stop_saver(saver, cfg.checkpoint_dir)
        raise
    finally:
        if saver is not None:
            saver.release()  # the folder's lock, whatever ended the run
    if recorder is not None:
        recorder.close()  # process 0 writes the trace (atomically)
        result.arrays = recorder.arrays
    elif trace_path is not None and jax.process_index() == 0:
        from .core.traces import trace

        trace.save(trace_path, result.meta, result.arrays)
    if trace_path is not None and jax.process_index() == 0:
        run_progress.kept(trace_path, f"trace {trace_path}")
    return result


def _train(cfg, dataset, par, state, start, saver, recorder, result, progress):
    """Steps start+1..cfg.steps: batch -> step -> log -> trace -> checkpoint."""
    import jax

    bar = _progress_bar(cfg, progress) if jax.process_index() == 0 else None
    t0 = t1 = time.perf_counter()
    run_progress.step_done(start)
    many = jax.process_count() > 1
    try:
        with _signals_deferred(many) as request:
            for k in range(start + 1, cfg.steps + 1):
                t_step = time.perf_counter()
                x, y = host_batch(cfg, dataset, k)  # the global batch; a process steps on its rows of it
                state, metrics = par.step(state, *(_process_rows(a, cfg.accum) for a in (x, y)))
                loss = float(metrics["loss"])
                if cfg.nan_check:  # before the step is recorded or checkpointed
                    check_finite(cfg, k, loss, metrics.get("finite"), par.problem.params)
                result.losses.append(loss)
                result.step_times.append(time.perf_counter() - t_step)  # float(loss) waited for the step
                if recorder is not None:
                    recorder.step(k, loss, metrics["grads"], par.params(state), x, y, state=metrics.get("state"))
                run_progress.step_done(k)
                request.armed = True  # from here a signal waits for the step's end (and a save in progress)
                saved = saver is not None and _save(saver, k, state, cfg, force=False)
                if k == start + 1:
                    t1 = time.perf_counter()
                    result.first_step_s = t1 - t0
                if bar is not None:
                    bar.set_postfix(loss=f"{loss:.4f}")
                    bar.update(1)
                _stop_here(k, k - start if many else 0, saver if not saved else None, state, cfg)
    finally:
        if bar is not None:
            bar.close()  # on Ctrl-C too: the command's one line then starts a clean line
    if saver is not None:
        saver.close()
    if cfg.steps - start > 1:
        result.steps_per_s = (cfg.steps - start - 1) / max(time.perf_counter() - t1, 1e-9)


def _signals_deferred(many: bool):
    """SIGINT and SIGTERM wait for the end of the step (`jaxdp.core.process.stop`). Several processes: SIGTERM is JAX's
    preemption notice (its handler, installed by jax.distributed, is left alone) and SIGINT is made one. JAX's sync
    point counts this run's steps from 0 (`_stop_here`): a notice before the first call agrees on 1, the run's
    first step, where a resumed run's step numbers would never reach it."""
    if not many:
        return stop.deferred()
    from jax.experimental import multihost_utils

    multihost_utils.reached_preemption_sync_point(0)
    return stop.deferred((signal.SIGINT,), notice=signal.SIGTERM)


def _stop_here(k: int, nth: int, saver, state, cfg) -> None:
    """After step `k`, the run's `nth` (0: one process): when a stop was asked (several processes: when every one
    has reached JAX's preemption sync point, the same step in all), save step `k` (unless just saved), Stopped."""
    if nth:
        from jax.experimental import multihost_utils

        signum = (stop.asked() or signal.SIGTERM) if multihost_utils.reached_preemption_sync_point(nth) else None
    else:
        signum = stop.asked()
    if signum is None:
        return
    if saver is not None:
        _save(saver, k, state, cfg, force=True)
    raise stop.Stopped(signum)


def _save(saver, k: int, state, cfg, force: bool) -> bool:
    """Checkpoint step `k` when it is due (or `force`); a signal meanwhile waits for it (`_signals_deferred`)."""
    if not saver.maybe_save(k, state, cfg, force=force):
        return False
    run_progress.kept(cfg.checkpoint_dir, f"checkpoint step {k} in {cfg.checkpoint_dir}")
    return True


def check_finite(cfg: RunConfig, k: int, loss: float, finite, params) -> None:
    """Raise NonFiniteLoss (exit 3) naming step `k` and the tensor, when the loss or the step's `finite` flags
    (strategies/finite.py: the gradient the update used and the updated parameters) show NaN or Inf."""
    fix = f"({cfg.strategy}, lr {cfg.lr}); lower --lr, set --clip-norm, or pass --no-nan-check to continue anyway"
    if not math.isfinite(loss):
        raise NonFiniteLoss(f"loss is {loss} at step {k} {fix}")
    if finite is None:
        return
    import jax

    from .strategies.common import to_host  # this host's copy, sharded or not (multi-process runs too)

    finite = jax.tree.map(to_host, finite)
    if not all(np.all(a) for a in jax.tree.leaves(finite)):
        from .strategies.finite import nonfinite_names

        names = nonfinite_names(finite, params)
        more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
        raise NonFiniteLoss(f"{names[0]} holds NaN or Inf at step {k}{more}, the loss {loss:.6g} finite; "
                            f"nothing of step {k} recorded or checkpointed {fix}")


def _stop_saver(saver, directory) -> None:
    """Ctrl-C: orbax's threads finish what the last save started (they fail at interpreter exit
    otherwise), and the latest complete checkpoint is the one kept."""
    with run_progress.sigint_deferred():  # a second Ctrl-C: the stop completes, the run stops as the first asked
        step = saver.stop()
        if step is not None:
            run_progress.kept(directory, f"checkpoint step {step} in {directory}")


def _process_rows(a, accum: int):
    """This process's rows of the global batch (devices are ordered by process, so process p owns
    the p-th share of every micro-batch: `data.part_rows`); all of it in a single-process run."""
    import jax

    from .core.run import data

    return data.part_rows(a, jax.process_index(), jax.process_count(), accum) if jax.process_count() > 1 else a


def _start(cfg: RunConfig, strategy, problem, optimizer):
    """(train state, steps already done, checkpointer or None): fresh, or restored with --resume."""
    state, start = strategy.init(), 0
    if not (cfg.resume or cfg.checkpoint_every > 0):
        return state, start, None
    import jax

    from . import checkpoint  # orbax: loaded only when checkpointing
    from .core.files import ckpt_folder

    lock = None
    if jax.process_index() == 0:  # the folder is this run's (ckpt_folder.py): before anything is read or written
        lock = ckpt_folder.claim(cfg.checkpoint_dir, "jax", resume=cfg.resume, overwrite=cfg.overwrite_checkpoints)
    try:
        if cfg.resume:
            state, start = checkpoint.restore(cfg.checkpoint_dir, cfg, strategy, problem, optimizer)
        if cfg.checkpoint_every > 0:
            return state, start, checkpoint.Checkpointer(cfg.checkpoint_dir, cfg.checkpoint_every, lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    if lock is not None:
        lock.release()
    return state, start, None

def summary(result: RunResult) -> str:
    cfg = result.cfg
    axis = f" (axis type {cfg.axis_type})" if cfg.strategy in JIT_STRATEGIES else ""
    return (f"{cfg.strategy}{axis} on {cfg.devices} {result.meta.get('platform', '?')} device(s), "
            f"{cfg.model}/{cfg.data}, "
            f"{cfg.dtype}: {cfg.steps} steps, loss {result.losses[0]:.4f} -> {result.losses[-1]:.4f}, "
            f"first step (compile) {result.first_step_s:.2f}s, {result.rate()}")


def _progress_bar(cfg, progress):
    if progress is False or (progress is None and not sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, desc=f"{cfg.strategy} x{cfg.devices}", unit="step", leave=False)
