"""`zero1`: ZeRO stage 1, the optimizer state sharded. Local gradients / N are all-reduced (every
device gets the whole mean gradient); each device keeps its shard of it and of the parameters, the
optimizer updates the shards, and the updated shards are all-gathered into full parameters
(`step.py`; the layout: `layout.ZERO1`). Accumulation syncs once, after the micro-batches' local sum.
"""
from __future__ import annotations

import jax

from ... import canonical
from ... import collectives as ring
from ...devices import AXIS
from ..common import local_grads
from .flat import my_shard
from .layout import ZERO1
from .step import make_strategy


def grads(problem, comm, shapes, n, opts):
    """`(params, x, y) -> (loss, my gradient shards, the whole mean gradient)`: one all-reduce."""
    def grads_of(params, x, y):
        loss, grads = local_grads(problem.loss_fn, params, x, y, opts.accum)
        grads = jax.tree.map(lambda g: g / n, grads)
        full = jax.tree.map(comm.all_reduce, grads)  # every device: the whole mean gradient
        return loss, jax.tree.map(lambda g: my_shard(g, n), full), full
    return grads_of


def canonical_grads(problem, comm, shapes, n, opts):
    """`grads` under reduction="canonical": per-shard values, the canonical all-reduce tree (every device
    the whole gradient), the canonical clip, then my shard of the flat padded to a multiple of BLOCKS."""
    shard_values = canonical.shard_values_of(problem)
    exchange, gather = ((lambda chunks: canonical.ppermute_exchange(chunks, AXIS)),
                        (lambda chunk: ring.ring_all_gather(chunk, AXIS))) if comm.kind == "ring" else (None, None)

    def sync(values):
        loss, grads = values
        return canonical.combine(loss, AXIS), canonical.all_reduce_tree(grads, AXIS, gather, exchange)

    def grads_of(params, x, y):
        loss, grads = canonical.step_values(shard_values, params, x, y, opts, n, sync)
        clipped = canonical.clip(grads, opts.clip_norm)
        return loss, jax.tree.map(lambda g: my_shard(g, n, canonical.BLOCKS), clipped), grads
    return grads_of


make = make_strategy(ZERO1, grads, canonical_grads)
