"""`zero2`: ZeRO stage 2, gradients sharded as well. Local gradients / N are reduce-scattered, so each
device only ever keeps its shard of the mean gradient; then as `zero1`: the optimizer updates the
shards and the updated shards are all-gathered into full parameters (`step.py`; the layout:
`layout.ZERO2`). Accumulation syncs once, after the micro-batches' local sum.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ... import canonical
from ...devices import AXIS
from ..common import local_grads
from .layout import ZERO2
from .step import make_strategy


def grads(problem, comm, shapes, n, opts):
    """`(params, x, y) -> (loss, my shards of the mean gradient, the same shards for the trace)`: one
    reduce-scatter."""
    def grads_of(params, x, y):
        loss, grads = local_grads(problem.loss_fn, params, x, y, opts.accum)
        grads = jax.tree.map(lambda g: g / n, grads)
        shards = jax.tree.map(lambda g: comm.reduce_scatter(g.reshape(-1)), grads)  # only my shard
        return loss, shards, shards
    return grads_of


def canonical_scatter(comm):
    """`sync((loss, grads))` under reduction="canonical": the loss by the canonical tree, the gradients
    as a canonical reduce-scatter of each flat padded to a multiple of BLOCKS (zero3 too). hsdp
    (`comm.replica`): the group's tree, then the tree over the groups of the group's sums (a canonical
    all-reduce of the chunk): device r S + s is leaf r S + s of the one tree over N, whose lower log2 S
    levels pair devices of a group (S a power of two), so the bits are the 1-D tree's."""
    exchange = (lambda chunks: canonical.ppermute_exchange(chunks, AXIS)) if comm.kind == "ring" else None

    def across(a, reduce):
        return reduce(a, comm.replica) if comm.replica else a

    def sync(values):
        loss, grads = values
        loss = across(canonical.combine(loss, AXIS), canonical.combine)
        padded = jax.tree.map(lambda g: jnp.pad(g.reshape(-1), (0, -g.size % canonical.BLOCKS)), grads)
        return loss, jax.tree.map(lambda g: across(canonical.combine_scatter(g, AXIS, exchange), canonical.all_reduce),
                                  padded)
    return sync


def sharded_grads_of(shard_values, comm, n, opts):
    """`(params, x, y) -> (loss, clipped gradient shards, unclipped shards for the trace)`: the per-shard
    values, `canonical_scatter`, then the clip by the canonical norm of the whole (sharded) gradient."""
    sync = canonical_scatter(comm)

    def grads_of(params, x, y):
        loss, grads = canonical.step_values(shard_values, params, x, y, opts, n, sync)
        return loss, canonical.clip(grads, opts.clip_norm, AXIS, sharded=True), grads
    return grads_of


def canonical_grads(problem, comm, shapes, n, opts):
    """`grads` under reduction="canonical" (`sharded_grads_of` on the full parameters' shard values)."""
    return sharded_grads_of(canonical.shard_values_of(problem), comm, n, opts)


make = make_strategy(ZERO2, grads, canonical_grads)
