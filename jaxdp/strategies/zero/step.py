"""The ZeRO step's skeleton, into which each stage (`zero1.py`, `zero2.py`, `zero3.py`) plugs its
gradient sync: local gradients -> the stage's sync -> the optimizer on the global flat arrays ->
(parameters not sharded) the updated shards all-gathered. Every layout choice is read from the stage's
row of `layout.py`; the reduction's fork (native or canonical) is here and only here.

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
from ...devices import AXIS
from ..common import Strategy, TrainState, compile_options, put_sharded
from . import flat
from .flat import COLLECTIVES, host_unshard, my_shard, unpad


def make_strategy(layout, native_grads, canonical_grads):
    """The strategy factory of one stage. `native_grads` / `canonical_grads` are
    `(problem, comm, shapes, n, opts) -> grads_of`, where `grads_of(params, x, y)` gives (loss, this
    device's gradient shards, the gradient for the trace, laid out as `layout.grad_spec`)."""
    def make(problem, optimizer, mesh, opts, return_grads=True) -> Strategy:
        n = mesh.size
        comm = COLLECTIVES[opts.collectives]
        shapes = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), problem.params)  # leaves, not tuples
        is_canonical = opts.reduction == "canonical"
        multiple = canonical.BLOCKS if is_canonical else n  # the flat layout's padding
        grads_of = (canonical_grads if is_canonical else native_grads)(problem, comm, shapes, n, opts)

        def device_grads(params, x, y):
            loss, grad_shards, grads_out = grads_of(params, x, y)
            param_shards = params if layout.shards_params else jax.tree.map(lambda p: my_shard(p, n, multiple), params)
            if not is_canonical:
                loss = lax.psum(loss, AXIS) / n  # one scalar all-reduce, for the log
            return loss, grad_shards, grads_out, param_shards

        sharded_grads = jax.shard_map(device_grads, mesh=mesh, in_specs=(layout.param_spec, P(AXIS), P(AXIS)),
                                      out_specs=(P(), P(AXIS), layout.grad_spec, P(AXIS)), check_vma=False)
        jit_step = jax.jit(train_step(layout, optimizer, mesh, comm, shapes, sharded_grads, return_grads),
                           donate_argnums=0, compiler_options=compile_options(opts))

        def step(state, x, y):
            state, metrics = jit_step(state, x, y)
            if return_grads and layout.shards_grads:
                metrics = {**metrics, "grads": host_unshard(metrics["grads"], shapes)}
            return state, metrics

        def full_params(state):
            return host_unshard(state.params, shapes) if layout.shards_params else state.params

        init = flat.init_sharded(layout, optimizer, mesh, multiple)
        return Strategy(f"zero{layout.stage}", init, put_sharded(mesh), step, full_params, jit_step)

    return make


def train_step(layout, optimizer, mesh, comm, shapes, sharded_grads, return_grads):
    """`(state, x, y) -> (state, metrics)`: the sync, the update on the flat arrays, and (when the layout
    gathers after the update) the full parameters rebuilt from everyone's updated shard."""
    gather = jax.shard_map(lambda f: jax.tree.map(lambda s, shape: unpad(comm.all_gather(s), shape), f, shapes),
                           mesh=mesh, in_specs=P(AXIS), out_specs=P(), check_vma=False)

    def step(state, x, y):
        loss, grad_flat, grads_out, param_flat = sharded_grads(state.params, x, y)
        param_flat, opt_state = flat.apply_global_update(optimizer, grad_flat, state.opt_state, param_flat)
        params = gather(param_flat) if layout.gathers_after_update else param_flat
        metrics = {"loss": loss, "grads": grads_out} if return_grads else {"loss": loss}
        return TrainState(params, opt_state), metrics

    return step
