"""zero3's gradient, FSDP by units: each unit of the model all-gathered just before its forward and
freed after it, gathered again just before its backward (not with reshard_after_forward=False), its
gradient reduce-scattered as backward produces it; under accumulation, FSDP's no_sync. The units'
mechanism (one `jax.custom_vjp` per unit, the value ties that keep the compiled schedule, the root's
shared parameters) is `models/unit_vjp.py`, which canonical's per-shard program runs too.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ...models import units as unit_lib
from ...models.unit_vjp import unit_loss
from ..grads import local_grads


def unit_grads(problem, shapes, gather_leaf, scatter_leaf, accum: int, reshard_after_forward: bool):
    """zero3's `(param shards, x, y) -> (mean loss, gradient shards)`, unit by unit: the units in
    order, then `problem.head(output, y)`; with no head, the units take `(x, y)` and give the loss
    (a plain loss function is one unit, `units.whole`: the whole model gathered at once). Parameters
    listed by several units (tied) belong to the root: `root_gather`, before the units.

    `gather_leaf(shard, shape)` -> the full parameter; `scatter_leaf(grad)` -> this device's shard of
    the summed gradient / N. accum == 1: each unit's gradient is reduce-scattered inside its
    backward. accum > 1 (FSDP's no_sync): every micro-batch gathers forward and backward, but the
    gradients stay full and local, summed over the micro-batches, and are reduce-scattered once.
    """
    loss, groups, group_shapes = unit_loss(problem, shapes, gather_leaf, scatter_leaf, reshard_after_forward,
                                           sync=accum == 1)

    def grads(param_shards, x, y):
        parts = unit_lib.split(param_shards, groups)
        if accum == 1:
            value, part_grads = jax.value_and_grad(loss)(parts, [None] * len(groups), x, y)
            return value, unit_lib.join(part_grads, groups)
        sinks = [jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shape) for shape in group_shapes]
        value, full = local_grads(lambda sinks, xb, yb: loss(parts, sinks, xb, yb), sinks, x, y, accum)
        return value, unit_lib.join(jax.tree.map(scatter_leaf, full), groups)

    return grads
