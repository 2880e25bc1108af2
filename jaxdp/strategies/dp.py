"""`dp`: parameter-server data parallelism, as torch.nn.DataParallel and the seeds describe it.

Every device computes the gradient of its slice of the batch; the gradients are *reduced to device
0* (a binomial tree of ppermutes, not an all-reduce); device 0 alone averages them and runs the
optimizer; the new parameters are *broadcast* from device 0 back to every device. Device 0 is the
parameter server and every byte passes through it, which is why DDP replaced this scheme.

The optimizer state is allocated on every device (SPMD runs one program everywhere) but only
device 0's copy is ever updated or read; the others keep their initial values.
"""
from __future__ import annotations

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from .. import canonical
from ..collectives import broadcast_from_root, reduce_to_root
from ..devices import AXIS
from . import finite
from .common import (
    Strategy,
    TrainState,
    apply_update,
    compile_options,
    init_replicated,
    local_grads,
    put_sharded,
)


def make(problem, optimizer, mesh, opts, return_grads=True) -> Strategy:
    n = mesh.size
    tree_map = jax.tree.map

    is_canonical = opts.reduction == "canonical"

    def device_step(params, opt_state, x, y):
        if is_canonical:  # the binomial tree to the root is the canonical tree (N a power of two)
            loss, grads = canonical.step_values(canonical.shard_values_of(problem), params, x, y, opts, n,
                                                lambda values: tree_map(lambda a: reduce_to_root(a, AXIS), values))
            loss = broadcast_from_root(loss, AXIS)
        else:
            loss, grads = local_grads(problem.loss_fn, params, x, y, opts.accum)
            grads = tree_map(lambda g: reduce_to_root(g, AXIS) / n, grads)  # the sum is valid on device 0 only
            loss = broadcast_from_root(reduce_to_root(loss, AXIS) / n, AXIS)  # every process logs it
        on_server = lax.axis_index(AXIS) == 0
        clipped = canonical.clip(grads, opts.clip_norm) if is_canonical else grads
        params, opt_state = lax.cond(on_server,
                                     lambda: apply_update(optimizer, clipped, opt_state, params),
                                     lambda: (params, opt_state))
        params = tree_map(lambda p: broadcast_from_root(p, AXIS), params)
        # The gradients are read from device 0, where they are the true averages.
        metrics = {"loss": loss, "grads": grads} if return_grads else {"loss": loss}
        if opts.nan_check:  # true on device 0 only, as the optimizer state: out_specs P() returns device 0's
            metrics["finite"] = finite.flags(clipped, params)
        return TrainState(params, opt_state), metrics

    # check_vma=False: ppermute results are "varying", and only device 0's optimizer state is true.
    sharded_step = jax.shard_map(device_step, mesh=mesh, in_specs=(P(), P(), P(AXIS), P(AXIS)),
                                 out_specs=P(), check_vma=False)
    step = jax.jit(lambda state, x, y: sharded_step(state.params, state.opt_state, x, y), donate_argnums=0,
                   compiler_options=compile_options(opts, problem.params, optimizer))
    return Strategy("dp", init_replicated(optimizer, mesh), put_sharded(mesh), step, lambda s: s.params)
