"""What every strategy shares: the train state, local gradients with accumulation, and the skeleton
of a replicated data-parallel step (local gradients -> one gradient sync -> the same update on
every device), into which ddp, ddp-bucket and ddp-ring each plug their own `sync`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import PartitionSpec as P

from .. import canonical
from ..devices import AXIS, batch_sharded, replicated
from . import finite
from .grads import local_grads  # noqa: F401 (re-exported: every strategy's first half)


class TrainState(NamedTuple):
    params: dict
    opt_state: optax.OptState
    batch_stats: dict | None = None  # running statistics (a model with nnx.BatchStat), replicated: stats.py


class Strategy(NamedTuple):
    """A strategy is a few plain functions (no hidden objects):
    - `init(params, opt_state=None)`: the train state placed on the devices (replicated or
      sharded); a fresh optimizer state, or the given full one (resuming from a checkpoint);
    - `put_batch(x, y)`: the global NumPy batch placed as `step` expects it;
    - `step(state, x, y)`: one optimizer step, jitted; returns (state, metrics) where metrics holds
      `loss` (mean over the global batch) and, when built with return_grads, `grads` (the full
      averaged gradient the update used, before clipping);
    - `full_params(state)`: the unsharded parameters (for the trace and checkpoints).
    `jit_step` is the jitted function behind `step` (to lower and inspect), when `step` wraps it.
    """
    name: str
    init: Callable
    put_batch: Callable
    step: Callable
    full_params: Callable
    jit_step: Callable | None = None

    @property
    def compiled_step(self):
        return self.jit_step or self.step


def to_numpy(tree):
    return jax.tree.map(lambda a: np.array(to_host(a)), tree)


def to_host(a) -> np.ndarray:
    """The full value of a (possibly sharded, possibly multi-process) array on this host. Arrays
    whose shards live partly in other processes are all-gathered: every process must call this
    in the same order."""
    if isinstance(a, jax.Array) and not a.is_fully_addressable and not a.is_fully_replicated:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(a, tiled=True))
    if isinstance(a, jax.Array) and a.is_fully_replicated:
        return np.asarray(a.addressable_shards[0].data)
    return np.asarray(jax.device_get(a))


def read_on(a, device) -> np.ndarray:
    """The value of `a` as `device` holds it (dp's gradients are true only on device 0 of the mesh)."""
    if getattr(a, "is_fully_replicated", False):
        for shard in a.addressable_shards:
            if shard.device == device:
                return np.asarray(shard.data)
    return to_host(a)


def apply_update(optimizer, grads, opt_state, params):
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def update_apart(update, current, loss, apart: bool):
    """`update()` (the new (params, opt_state)), in a computation of its own when `apart`: in canonical's
    steps fusion recomputes the new moments from the old ones inside the parameters' update, and since a
    donated array's old value is read after its new value is written, XLA copies donated arrays at the
    step's entry (on the bench's mlp: 1 on ddp, 3 on zero2; 19 copies, 12.6 MiB a step, while canonical
    compiled with the simplifier off). As a branch of a conditional
    (a predicate always true that the compiler cannot know: `loss` is NaN or it is not) the update
    reads the old state and writes the new one in place. The same element-wise operations: the same bits."""
    if not apart:
        return update()
    return lax.cond(jnp.isnan(loss) | ~jnp.isnan(loss), update, lambda: current)


def init_replicated(optimizer, mesh):
    """`init` for strategies that keep a full copy of params and optimizer state on every device."""
    def init(params, opt_state=None):
        params = jax.device_put(to_numpy(params), replicated(mesh))  # fresh buffers: step donates them
        if opt_state is None:
            opt_state = jax.jit(optimizer.init, out_shardings=replicated(mesh))(params)
        else:
            opt_state = jax.device_put(to_numpy(opt_state), replicated(mesh))
        return TrainState(params, opt_state)
    return init


def put_sharded(mesh):
    """`put_batch` for a batch split over `data`: each process passes the rows of its own devices
    (all rows in a single-process run) and gets the global arrays."""
    def put_batch(x, y):
        sharding = batch_sharded(mesh)
        return tuple(jax.make_array_from_process_local_data(sharding, a) for a in (x, y))
    return put_batch


def compile_options(opts, params, optimizer, extra: dict | None = None) -> dict | None:
    """The step's `jax.jit` compiler options: `extra`, plus canonical's passes off for `optimizer` on
    `params` (`canonical.compiler.compiler_options`; lists joined)."""
    if opts.reduction != "canonical":
        return extra
    merged = dict(extra or {})
    for key, value in canonical.compiler.compiler_options(params, optimizer).items():
        merged[key] = ",".join(filter(None, [merged.get(key, ""), value]))
    return merged


def replicated_data_parallel(name, problem, optimizer, mesh, opts, sync, *, check_vma: bool,
                             return_grads: bool, compiler_options: dict | None = None,
                             canonical_sync=None) -> Strategy:
    """The DDP skeleton. `sync(grads)` must turn each device's local mean gradient into the global
    mean (every device the same), communicating once; under `reduction="canonical"`,
    `canonical_sync((loss, grads))` adds the devices' partial sums by the canonical tree instead.

    The shard_map trap: with check_vma=True, replicated params used with per-device data are
    implicitly cast to "varying", and the transpose of that cast is a psum, so jax.grad would return
    gradients already summed over devices. We cast explicitly first (`lax.pcast(..., to='varying')`),
    which makes the gradient local and leaves the one reduction to `sync`. With check_vma=False (used
    where `sync` is built from ppermute, whose results JAX cannot prove identical, and for canonical)
    there is no implicit cast and grad is local as it is. `compiler_options` go to this step's
    `jax.jit` only.
    """
    n = mesh.size
    is_canonical = opts.reduction == "canonical"
    check_vma = check_vma and not is_canonical

    def native_grads(params, x, y):
        local = lax.pcast(params, AXIS, to="varying") if check_vma else params
        loss, grads = local_grads(problem.loss_fn, local, x, y, opts.accum)
        grads = sync(grads)
        return lax.pmean(loss, AXIS), grads, grads  # the loss: one scalar all-reduce, for the log

    def canonical_grads(params, x, y):
        loss, grads = canonical.step_values(canonical.shard_values_of(problem), params, x, y, opts, n, canonical_sync)
        return loss, canonical.clip(grads, opts.clip_norm), grads

    grads_of = canonical_grads if is_canonical else native_grads  # (loss, the update's gradient, the trace's)

    def device_step(params, opt_state, x, y):
        loss, clipped, grads = grads_of(params, x, y)
        params, opt_state = update_apart(lambda: apply_update(optimizer, clipped, opt_state, params),
                                         (params, opt_state), loss, is_canonical)
        metrics = {"loss": loss, "grads": grads} if return_grads else {"loss": loss}
        return TrainState(params, opt_state), finite.with_flags(metrics, clipped, params, opts.nan_check)

    sharded_step = jax.shard_map(device_step, mesh=mesh, in_specs=(P(), P(), P(AXIS), P(AXIS)),
                                 out_specs=P(), check_vma=check_vma)
    step = jax.jit(lambda state, x, y: sharded_step(state.params, state.opt_state, x, y), donate_argnums=0,
                   compiler_options=compile_options(opts, problem.params, optimizer, compiler_options))
    return Strategy(name, init_replicated(optimizer, mesh), put_sharded(mesh), step, lambda s: s.params)
