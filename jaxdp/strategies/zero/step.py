"""The ZeRO step's skeleton, into which each stage (`zero1.py`, `zero2.py`, `zero3.py`) plugs its
gradient sync: local gradients -> the stage's sync -> the optimizer on the global flat arrays ->
(parameters not sharded) the updated shards all-gathered. Every layout choice is read from the stage's
row of `layout.py`; the reduction's fork (native or canonical) is here and only here.

The mesh is `data` alone, or hsdp's grid (`replica`, `data`): the flat shards then live on `data`
(within a group: S = mesh.shape['data'] shards, the same in every group), the batch is split over both
axes (`devices.batch_spec`), the gradient is divided by the N devices of the mesh, and each reduction
ends across the groups (`flat.across_groups`); a 1-D mesh is the grid with one group.

All run under shard_map(check_vma=False): gradients of replicated inputs are then local, with no
implicit psum. The optimizer runs outside the shard_map, in the same jit, on the global flat arrays
([N x S], sharded over `data`): any optax transformation then has global semantics, and XLA inserts
the reductions it needs (a `clip_by_global_norm` in a user's chain takes the norm of the whole
gradient, not the shard's; the zero padding adds nothing to it).
"""
from __future__ import annotations

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from ... import canonical
from ...devices import AXIS, REPLICA, batch_spec
from .. import finite
from ..common import Strategy, TrainState, compile_options, put_sharded, update_apart
from . import flat
from .flat import COLLECTIVES, host_unshard, my_shard, unpad


def make_strategy(layout, native_grads, canonical_grads, name: str | None = None):
    """The strategy factory of one stage (named `name`, default zeroK). `native_grads` / `canonical_grads`
    are `(problem, comm, shapes, n, opts) -> grads_of` (n: the mesh's devices, all groups), where
    `grads_of(params, x, y)` gives (loss, this device's gradient shards, the gradient for the trace, laid
    out as `layout.grad_spec`)."""
    def make(problem, optimizer, mesh, opts, return_grads=True) -> Strategy:
        n, s = mesh.size, mesh.shape[AXIS]  # all devices (the mean's divisor); the shards (a group's devices)
        comm = COLLECTIVES[opts.collectives]
        if REPLICA in mesh.axis_names:
            comm = flat.across_groups(comm, REPLICA)
        shapes = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), problem.params)  # leaves, not tuples
        is_canonical = opts.reduction == "canonical"
        multiple = canonical.BLOCKS if is_canonical else s  # the flat layout's padding
        grads_of = (canonical_grads if is_canonical else native_grads)(problem, comm, shapes, n, opts)

        def device_grads(params, x, y):
            loss, grad_shards, grads_out = grads_of(params, x, y)
            param_shards = params if layout.shards_params else jax.tree.map(lambda p: my_shard(p, s, multiple), params)
            if not is_canonical:
                loss = lax.psum(loss, mesh.axis_names) / n  # one scalar all-reduce, for the log
            return loss, grad_shards, grads_out, param_shards

        rows = batch_spec(mesh)
        sharded_grads = jax.shard_map(device_grads, mesh=mesh, in_specs=(layout.param_spec, rows, rows),
                                      out_specs=(P(), P(AXIS), layout.grad_spec, P(AXIS)), check_vma=False)
        program = train_step(layout, optimizer, mesh, comm, shapes, sharded_grads, return_grads, opts.nan_check,
                             apart=opts.reduction == "canonical")
        jit_step = jax.jit(program, donate_argnums=0, compiler_options=compile_options(opts, problem.params, optimizer))

        def step(state, x, y):
            state, metrics = jit_step(state, x, y)
            if return_grads and layout.shards_grads:
                metrics = {**metrics, "grads": host_unshard(metrics["grads"], shapes)}
            return state, metrics

        def full_params(state):
            return host_unshard(state.params, shapes) if layout.shards_params else state.params

        init = flat.init_sharded(layout, optimizer, mesh, multiple)
        return Strategy(name or f"zero{layout.stage}", init, put_sharded(mesh), step, full_params, jit_step)

    return make


def train_step(layout, optimizer, mesh, comm, shapes, sharded_grads, return_grads, check: bool = True,
               apart: bool = False):
    """`(state, x, y) -> (state, metrics)`: the sync, the update on the flat arrays (`apart`: in a
    computation of its own, `common.update_apart`), and (when the layout gathers after the update) the full
    parameters rebuilt from everyone's updated shard."""
    gather = jax.shard_map(lambda f: jax.tree.map(lambda s, shape: unpad(comm.all_gather(s), shape), f, shapes),
                           mesh=mesh, in_specs=P(AXIS), out_specs=P(), check_vma=False)

    def step(state, x, y):
        loss, grad_flat, grads_out, param_flat = sharded_grads(state.params, x, y)
        param_flat, opt_state = update_apart(
            lambda: flat.apply_global_update(optimizer, grad_flat, state.opt_state, param_flat),
            (param_flat, state.opt_state), loss, apart)
        params = gather(param_flat) if layout.gathers_after_update else param_flat
        metrics = {"loss": loss, "grads": grads_out} if return_grads else {"loss": loss}
        if check:  # each device's part of the flat shards, reduced where it lies (no collective)
            metrics["finite"] = finite.shard_flags(grad_flat, param_flat, mesh.shape[AXIS])
        return TrainState(params, opt_state), metrics

    return step
