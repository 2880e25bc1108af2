"""`single`: one device, the whole global batch. The oracle every other strategy must equal.
Under `reduction="canonical"` it is ddp's program on a one-device mesh: the compiler then sees the same
partitioned program on 1 device as on N (with the simplifier on, a plain `jit` compiled the update otherwise)."""
from __future__ import annotations

import functools

import jax

from .. import devices
from . import ddp, finite
from .common import Strategy, TrainState, apply_update, local_grads, to_numpy


def make(problem, optimizer, mesh, opts, return_grads=True) -> Strategy:
    if opts.reduction == "canonical":  # ddp's program on this one device: the same HLO as on N (docs/CANONICAL.md)
        return ddp.make(problem, optimizer, devices.mesh(mesh.devices.flat[:1]), opts, return_grads)._replace(
            name="single")
    device = mesh.devices.flat[0]
    on_device = jax.sharding.SingleDeviceSharding(device)

    def init(params, opt_state=None):
        params = jax.device_put(to_numpy(params), on_device)
        if opt_state is not None:
            return TrainState(params, jax.device_put(to_numpy(opt_state), on_device))
        return TrainState(params, jax.jit(optimizer.init, out_shardings=on_device)(params))

    @functools.partial(jax.jit, donate_argnums=0)  # the state updated in place, as every strategy's
    def step(state, x, y):
        loss, grads = local_grads(problem.loss_fn, state.params, x, y, opts.accum)
        params, opt_state = apply_update(optimizer, grads, state.opt_state, state.params)
        metrics = {"loss": loss, "grads": grads} if return_grads else {"loss": loss}
        return TrainState(params, opt_state), finite.with_flags(metrics, grads, params, opts.nan_check)

    def put_batch(x, y):
        return jax.device_put((x, y), device)

    return Strategy("single", init, put_batch, step, lambda s: s.params)
