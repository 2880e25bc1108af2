"""The library API: `setup_devices` and `parallelize`, any model and any optax optimizer under every
strategy of `jaxdp train` (which is built on them: one path).

    jaxdp.setup_devices(4)                      # first, before any JAX computation
    par = jaxdp.parallelize(loss_fn, params, optax.adam(1e-3), strategy="zero2", accum=2)
    state = par.init()
    for x, y in batches:                        # the global batch, as NumPy
        state, metrics = par.step(state, x, y)  # metrics["loss"]: the global mean loss
    final = par.params(state)                   # full parameters, as NumPy
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from . import devices as devices_mod
from . import models, strategies
from .core.run import data
from .core.run.config import ConfigError
from .core.run.kernels import KERNELS
from .core.run.reduction import resolve_shards, row_tokens
from .models import attention, cast_once
from .optax_check import check_elementwise
from .strategies import stats
from .strategies.common import read_on
from .strategies.zero import layout as zero_layout


class Parallel(NamedTuple):
    """What `parallelize` returns: three verbs on host values, and the pieces behind them.

    - `init(params=None, opt_state=None)` -> the train state on the devices (the given or the
      parallelized parameters; a fresh optimizer state, or the given full one to resume);
    - `step(state, x, y)` -> (state, metrics): x and y the global batch as NumPy (in a multi-process
      run, this process's rows: `jaxdp.core.run.data.part_rows(x, process, processes, accum)`);
      `metrics["loss"]` the global mean loss, `metrics["grads"]` (with return_grads) the full
      averaged gradient before the optimizer, a NumPy pytree like params; `metrics["state"]` (a
      model with `nnx.BatchStat` variables) the running statistics after the step, in the Flax layout;
    - `params(state)` -> the full parameters as NumPy.
    `strategy` is the device-level `Strategy` (its `put_batch` and `compiled_step` lower and inspect
    the compiled program), `problem` what it trains, `mesh` where.
    """
    init: Callable
    step: Callable
    params: Callable
    strategy: strategies.Strategy
    problem: models.Problem
    mesh: Mesh
    accum: int

    # The device-level verbs, so a Parallel can stand where a Strategy is read (inspect, accounting).
    @property
    def name(self) -> str:
        return self.strategy.name

    @property
    def put_batch(self):
        return self.strategy.put_batch

    @property
    def compiled_step(self):
        return self.strategy.compiled_step

    @property
    def full_params(self):
        return self.strategy.full_params


def setup_devices(n: int, platform: str = "auto", reduction: str = "native") -> list:
    """The first `n` devices of `platform` ('auto': the accelerators when present, else `n` simulated
    CPU devices). Call it first in the process, before any JAX computation: the count of simulated
    devices is fixed when JAX starts (asking for more afterwards is an error naming the fix).
    `reduction="canonical"`: also sets what `parallelize(reduction="canonical")` needs (no fused
    multiply-adds on XLA:CPU: `jaxdp.devices.request_no_fma`; one size of XLA:CPU's intra-op thread pool in
    every process: `jaxdp.devices.request_fixed_threads`)."""
    return devices_mod.setup(n, platform, reduction=reduction)


def parallelize(loss_fn, params, optimizer, *, strategy: str, devices=None, mesh: Mesh | None = None,
                accum: int = 1, return_grads: bool = False, kernels: str = "mirrored", compute_dtype=None,
                **strategy_options) -> Parallel:
    """Train `loss_fn(params, x, y)` (any pure JAX function returning the mean loss of the rows it
    gets; `params` any pytree of arrays) with the optax `optimizer` under `strategy` (a name of
    `jaxdp train --strategy`, or `fsdp` for zero3) on `devices` (a count, a list, or None: all of
    JAX's; `single` takes the first) or a one-axis `mesh` named 'data'.

    An NNX module may stand in for `loss_fn` with `loss=` a callable `(outputs, y) -> mean loss`
    (`params` None, or the module's parameters as a pure dict, which must agree with it).

    Options (each strategy accepts its own; an unknown one is an error listing them): `bucket_mb`
    (ddp-bucket), `collectives` "xla" or "ring" (zero1/2/3, hsdp), `reshard_after_forward` (zero3, hsdp),
    `replicas` (hsdp: R groups of N / R devices, zero3 within a group and replicated across; R divides N),
    `hsdp_hosts` (hsdp: "shard" or "replica"), `axis_type` (ddp-jit, zero1-jit, fsdp-jit: "auto" or "explicit").

    Any optax GradientTransformation keeps its global semantics: under ZeRO it runs on the global
    sharded arrays (a `clip_by_global_norm` sees the whole gradient's norm). One that depends on the
    parameters' shapes (e.g. `optax.contrib.muon`) cannot run on ZeRO's flat shards: an error names it.

    zero3 gathers, runs and frees one FSDP unit at a time: an NNX module's `unit_specs()` (jaxdp/models/
    units.py: units in forward order, `__call__` their fold); otherwise, and for a plain loss_fn, the
    whole loss is one unit, gathered at once (again for backward, its gradient reduce-scattered):
    sharded between steps, the step's peak about zero2's. Give `unit_specs()` to shard by layer.

    `kernels="fused"` (docs/KERNELS.md): an NNX module's attention that offers the choice (jaxdp's gpt, gpt2,
    llama) runs `jax.nn.dot_product_attention`; `compute_dtype` (e.g. jnp.bfloat16, fused only) casts the
    floating parameters to it once per step, the master values, gradients and optimizer staying as given.
    """
    loss = strategy_options.pop("loss", None)
    name = strategies.resolve(strategy)
    opts = strategies.options(name, accum, **strategy_options)
    problem = _fused(_problem(loss_fn, params, loss, kernels), kernels, compute_dtype)
    mesh = _mesh(name, devices, mesh)
    if zero_layout.of(name).shards_opt_state:  # the optimizer runs on flat padded shards
        check_elementwise(optimizer, problem.params, mesh.size)
    if opts.reduction == "canonical":
        _check_canonical(problem, mesh)
    strat = strategies.make(name, problem, optimizer, mesh, opts, return_grads=return_grads)
    first = mesh.devices.flat[0]
    checked: set = set()
    train_step = _with_state(name, strat, stats.make(name, problem, mesh, accum, opts), mesh)

    def init(params=None, opt_state=None):
        state = strat.init(problem.params if params is None else params, opt_state)
        return state if problem.state is None else state._replace(batch_stats=stats.place(name, problem.state, mesh))

    def step(state, x, y):
        x, y = np.asarray(x), np.asarray(y)
        signature = (x.shape, x.dtype, y.shape, y.dtype)
        if signature not in checked:  # before compiling: one line naming the fix
            _check_batch(problem, mesh, accum, x, y)
            if opts.reduction == "canonical":
                resolve_shards(opts.shards, x.shape[0] * jax.process_count() // accum, mesh.size,
                               row_tokens(x.shape, np.issubdtype(x.dtype, np.integer)))
            checked.add(signature)
        # Micro-batch j is rows [j B/A, (j+1) B/A) on every strategy and N; each device its chunk of it.
        x, y = (data.micro_major(a, len(mesh.local_devices), accum) for a in (x, y))
        state, metrics = train_step(state, x, y)
        return state, jax.tree.map(lambda a: read_on(a, first), metrics)

    def full(state):
        return jax.tree.map(lambda a: read_on(a, first), strat.full_params(state))

    return Parallel(init, step, full, strat, problem, mesh, accum)


def _with_state(name: str, strat, stats_step, mesh: Mesh):
    """The strategy's step, and with a model's running statistics (`stats_step`, not None) their
    forward-only program on the same rows and parameters before it (jaxdp/strategies/stats.py)."""
    if stats_step is None:
        return lambda state, x, y: strat.step(state, *strat.put_batch(x, y))

    def step(state, x, y):
        xb, yb = strat.put_batch(x, y)
        params, x_rows = strategies.stats_inputs(name, strat.full_params, state, xb, (x, y), mesh)
        batch_stats = jax.block_until_ready(stats_step(params, state.batch_stats, x_rows))  # before step donates params
        state, metrics = strat.step(state._replace(batch_stats=None), xb, yb)
        return state._replace(batch_stats=batch_stats), {**metrics, "state": batch_stats}

    return step


def _check_canonical(problem, mesh: Mesh) -> None:
    """What reduction="canonical" needs before compiling; one line naming the fix."""
    if mesh.devices.flat[0].platform != "cpu":
        return
    if not devices_mod.no_fma_flag_set():
        raise ConfigError(f"reduction='canonical' on CPU needs XLA_FLAGS={devices_mod.NO_FMA} set before JAX "
                          f"starts: call jaxdp.setup_devices(n, reduction='canonical') first in the process")
    if not devices_mod.fixed_threads_set():  # the pool would be max(CPUs, devices): other bits for other N
        raise ConfigError(f"reduction='canonical' on CPU needs {devices_mod.THREADS_ENV} set before JAX starts "
                          f"(XLA:CPU's thread pool, sized by the process's device count otherwise, changes a matrix "
                          f"product's bits): call jaxdp.setup_devices(n, reduction='canonical') first in the process")


def _fused(problem: models.Problem, kernels: str, compute_dtype) -> models.Problem:
    if kernels not in KERNELS:
        raise ConfigError(f"kernels={kernels!r}; valid: {', '.join(KERNELS)}")
    if compute_dtype is None:
        return problem
    if kernels != "fused":
        raise ConfigError("compute_dtype= casts the weights once per step, which is kernels='fused'; the mirrored path "
                          "computes in the module's own dtype=: pass kernels='fused' or drop compute_dtype")
    return cast_once.problem(problem, jnp.dtype(compute_dtype))


def _problem(loss_fn, params, loss, kernels: str = "mirrored") -> models.Problem:
    if isinstance(loss_fn, nnx.Module):
        if loss is None:
            raise ConfigError("an NNX module needs loss=: a callable (outputs, y) -> the mean loss")
        with attention.switched(loss_fn, kernels) if kernels == "fused" else contextlib.nullcontext():
            problem = models.from_module(loss_fn, loss)
        if params is not None:
            _check_agree(params, problem.params, type(loss_fn).__name__)
            problem = problem._replace(params=params)
        return problem
    if loss is not None:
        raise ConfigError("loss= is for an NNX module; a loss_fn(params, x, y) already returns the loss: drop loss=")
    if not callable(loss_fn):
        raise ConfigError(f"loss_fn is a {type(loss_fn).__name__}; give loss_fn(params, x, y) or an NNX module")
    if params is None or not jax.tree.leaves(params):
        raise ConfigError("params is empty; give the pytree of arrays loss_fn(params, x, y) trains")
    return models.from_loss(loss_fn, params)


def _check_agree(given, expected, model: str) -> None:
    """`given` params must have the model's names and shapes; one line naming the first differences."""
    got, want = models.flat_names(given), models.flat_names(expected)
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    if missing or extra:
        raise ConfigError(f"params do not match {model}: missing {missing[:3]}, unexpected {extra[:3]}; "
                          f"pass params=None to use the module's own, or nnx.to_pure_dict(nnx.state(model, nnx.Param))")
    for k in want:
        if np.shape(got[k]) != np.shape(want[k]):
            raise ConfigError(f"params do not match {model}: {k!r} has shape {np.shape(got[k])}, the module's "
                              f"{np.shape(want[k])}; pass params=None to use the module's own")


def _mesh(name: str, devices, mesh: Mesh | None) -> Mesh:
    if mesh is not None:
        if devices is not None:
            raise ConfigError("give devices= or mesh=, not both")
        if mesh.axis_names != (devices_mod.AXIS,):
            raise ConfigError(f"mesh axes {mesh.axis_names}; strategies run on one axis named "
                              f"{devices_mod.AXIS!r}: jaxdp.devices.mesh(devices) builds it")
        found = list(mesh.devices.flat)
    else:
        available = jax.devices()
        if devices is None:
            found = available[:1] if name in strategies.ONE_DEVICE else available
        elif isinstance(devices, int):
            if devices > len(available):
                kind = available[0].platform
                raise ConfigError(f"devices={devices} but JAX has {len(available)} {kind} device(s); call "
                                  f"jaxdp.setup_devices({devices}) first in the process, before any JAX computation")
            found = available[:devices]
        else:
            found = list(devices)
    if name in strategies.ONE_DEVICE and len(found) != 1:
        raise ConfigError(f"strategy {name!r} runs on one device, not {len(found)}: pass devices=1")
    return mesh if mesh is not None else devices_mod.mesh(found)


def _check_batch(problem, mesh: Mesh, accum: int, x, y) -> None:
    """Rows that divide over this process's devices x accum, and a loss that is a scalar."""
    if x.ndim == 0 or y.ndim == 0 or x.shape[0] != y.shape[0]:
        raise ConfigError(f"x and y must be batches with the same rows; got shapes {x.shape} and {y.shape}")
    local = len(mesh.local_devices)
    per, rows = local * accum, x.shape[0]
    if rows % per:
        lo = rows // per * per
        near = f"{lo}, {lo + per}" if lo else f"{per}, {2 * per}"
        raise ConfigError(f"a batch of {rows} rows does not divide over {local} device(s) x accum {accum} = {per}; "
                          f"valid sizes near it: {near}")
    micro = rows // per
    shapes = jax.tree.map(lambda p: jax.ShapeDtypeStruct(np.shape(p), getattr(p, "dtype", None) or np.result_type(p)),
                          problem.params)
    out = jax.eval_shape(problem.loss_fn, shapes, jax.ShapeDtypeStruct((micro, *x.shape[1:]), x.dtype),
                         jax.ShapeDtypeStruct((micro, *y.shape[1:]), y.dtype))
    if not hasattr(out, "shape") or out.shape != ():
        got = f"shape {out.shape}" if hasattr(out, "shape") else type(out).__name__
        raise ConfigError(f"the loss must be a scalar (the mean over the rows it gets), got {got}; "
                          f"reduce it, e.g. jnp.mean(...)")
