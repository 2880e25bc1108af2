"""`single`: one device, the whole global batch. The oracle every other strategy must equal."""
from __future__ import annotations

import jax

from .. import canonical
from . import finite
from .common import Strategy, TrainState, apply_update, compile_options, local_grads, to_numpy


def make(problem, optimizer, mesh, opts, return_grads=True) -> Strategy:
    device = mesh.devices.flat[0]
    on_device = jax.sharding.SingleDeviceSharding(device)

    def init(params, opt_state=None):
        params = jax.device_put(to_numpy(params), on_device)
        if opt_state is not None:
            return TrainState(params, jax.device_put(to_numpy(opt_state), on_device))
        return TrainState(params, jax.jit(optimizer.init, out_shardings=on_device)(params))

    is_canonical = opts.reduction == "canonical"

    @jax.jit
    def step(state, x, y):
        if is_canonical:  # all S shards here: the whole tree on this device
            loss, grads = canonical.step_values(canonical.shard_values_of(problem), state.params, x, y, opts, 1, None)
        else:
            loss, grads = local_grads(problem.loss_fn, state.params, x, y, opts.accum)
        clipped = canonical.clip(grads, opts.clip_norm) if is_canonical else grads
        params, opt_state = apply_update(optimizer, clipped, state.opt_state, state.params)
        metrics = {"loss": loss, "grads": grads} if return_grads else {"loss": loss}
        return TrainState(params, opt_state), finite.with_flags(metrics, clipped, params, opts.nan_check)

    def put_batch(x, y):
        return jax.device_put((x, y), device)

    step = jax.jit(step.__wrapped__, compiler_options=compile_options(opts))
    return Strategy("single", init, put_batch, step, lambda s: s.params)
