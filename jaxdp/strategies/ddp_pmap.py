"""`ddp-pmap`: `ddp` written with `jax.pmap`, the older SPMD API: state is stacked with a leading
device axis (one copy per device), each device sees its slice without that axis, and `psum` over
the named axis averages the gradients. Same update as `ddp`, divided by N before the psum.
"""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .. import canonical
from ..devices import AXIS, replicated
from . import finite
from .common import (
    Strategy,
    TrainState,
    apply_update,
    compile_options,
    local_grads,
    put_sharded,
    to_numpy,
)
from .ddp import all_reduce_mean


def with_options(pmapped, options: dict | None):
    """`pmapped`, compiled with XLA `options` (jax.pmap takes none: lowered and compiled once per
    input signature instead)."""
    if not options:
        return pmapped
    compiled = {}

    def run(*args):
        key = str(jax.tree.map(lambda a: (a.shape, a.dtype), args))
        if key not in compiled:
            compiled[key] = pmapped.lower(*args).compile(compiler_options=options)
        return compiled[key](*args)

    return run


def host_full(a, like):
    """A saved array of this strategy's state (one copy per device, stacked) -> the full array."""
    return a[0]


def stats_inputs(full_params, state, x_placed, host, mesh):
    """(params, x) for the running statistics' program (`stats.py`), which takes the parameters
    replicated and x split over `data`: pmap's per-device stacks are not that layout."""
    return jax.device_put(full_params(state), replicated(mesh)), put_sharded(mesh)(*host)[0]


def make(problem, optimizer, mesh, opts, return_grads=True) -> Strategy:
    n = mesh.size
    stacked = NamedSharding(mesh, P(AXIS))
    pmap_devices = list(mesh.devices.flat)

    def init(params, opt_state=None):
        # pmap takes this process's share: one copy per local device (all N in one process).
        def copies(tree):
            return jax.tree.map(lambda a: np.stack([a] * len(mesh.local_devices)), to_numpy(tree))
        # Built by pmap itself so the state carries pmap's own sharding (no recompile at step 2).
        if opt_state is not None:
            return jax.pmap(TrainState, axis_name=AXIS, devices=pmap_devices)(copies(params), copies(opt_state))
        return jax.pmap(lambda p: TrainState(p, optimizer.init(p)), axis_name=AXIS,
                        devices=pmap_devices)(copies(params))

    def native_grads(params, x, y):
        loss, grads = local_grads(problem.loss_fn, params, x, y, opts.accum)
        grads = all_reduce_mean(grads, n)
        return jax.lax.pmean(loss, AXIS), grads, grads

    def canonical_grads(params, x, y):
        loss, grads = canonical.step_values(canonical.shard_values_of(problem), params, x, y, opts, n,
                                            lambda values: canonical.all_reduce_tree(values, AXIS))
        return loss, canonical.clip(grads, opts.clip_norm), grads

    grads_of = canonical_grads if opts.reduction == "canonical" else native_grads  # (loss, update's, trace's)

    def device_step(state, x, y):
        loss, clipped, grads = grads_of(state.params, x, y)
        params, opt_state = apply_update(optimizer, clipped, state.opt_state, state.params)
        metrics = {"loss": loss, "grads": grads} if return_grads else {"loss": loss}
        return TrainState(params, opt_state), finite.with_flags(metrics, clipped, params, opts.nan_check)

    pmapped = jax.pmap(device_step, axis_name=AXIS, devices=pmap_devices, donate_argnums=0)
    run = with_options(pmapped, compile_options(opts, problem.params, optimizer))

    def step(state, x, y):
        state, metrics = run(state, x, y)
        return state, jax.tree.map(lambda a: a[0], metrics)

    def put_batch(x, y):  # this process's rows -> [local devices, rows per device, ...]
        local = len(mesh.local_devices)
        def split(a):
            return a.reshape(local, a.shape[0] // local, *a.shape[1:])
        return tuple(jax.make_array_from_process_local_data(stacked, split(a)) for a in (x, y))

    return Strategy("ddp-pmap", init, put_batch, step,
                    lambda s: jax.tree.map(lambda a: a[0], s.params), pmapped)
