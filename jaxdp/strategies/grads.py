"""Each device's own gradient: the mean loss and gradient over its micro-batches, with no communication
(every strategy's first half; the sync is the strategy's own)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def local_grads(loss_fn, params, x, y, accum: int):
    """Mean loss and mean gradient over `accum` equal micro-batches of this device's batch.

    No communication happens here: accumulation is local and the caller syncs once per step (the
    `no_sync` idea). The mean of equal-sized micro-batch means is the mean over all the samples.
    """
    grad_fn = jax.value_and_grad(loss_fn)
    xs = x.reshape(accum, x.shape[0] // accum, *x.shape[1:])
    ys = y.reshape(accum, y.shape[0] // accum, *y.shape[1:])
    loss, grads = grad_fn(params, xs[0], ys[0])
    if accum > 1:
        def micro_step(carry, batch):
            loss_sum, grad_sum = carry
            micro_loss, g = grad_fn(params, *batch)
            return (loss_sum + micro_loss, jax.tree.map(jnp.add, grad_sum, g)), None

        (loss, grads), _ = lax.scan(micro_step, (loss, grads), (xs[1:], ys[1:]))
        loss = loss / accum
        grads = jax.tree.map(lambda g: g / accum, grads)
    return loss, grads
