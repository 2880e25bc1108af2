"""The canonical step that every strategy shares (the definition: `reduce.py`): each shard's loss and
gradient by one program, each shard folded over the micro-batches, this device's subtree (streamed:
each shard enters the tree as it finishes, `streamed_partials`), then the strategy's `sync` of the
partial sums by the tree, then / S and / A (`step_values`).

The per-shard program is the model run unit by unit as zero3 runs it (`unit_value_and_grad`:
`models.unit_vjp`, one custom_vjp per unit, its non-matmul values recomputed in backward), for every
strategy. A strategy hands its part and nothing here asks which strategy runs: `gather_leaf` (zero3,
hsdp: each unit's parameters gathered from the shards; the others hold full ones) and `sync` (how its
devices' partial sums meet: an all-reduce, zero2's reduce-scatter, dp's gather to the server...). A
model with running statistics (BatchNorm couples the shards): `batchnorm.shard_values`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ..core.run.reduction import resolve_shards, row_tokens
from ..models import unit_vjp
from . import batchnorm, reduce


def unit_value_and_grad(problem, gather_leaf=None, reshard_after_forward: bool = True):
    """canonical's per-shard program: `(params, x, y) -> (loss, gradient)` with the model run unit by
    unit as zero3 runs it (one custom_vjp per unit, its non-matmul values recomputed in backward), for
    every strategy: `gather_leaf(param, shape)` gives a full parameter (default: the parameter itself,
    for strategies that hold full ones). Measured: XLA:CPU compiles the plain `jax.value_and_grad` of
    GPT into a program whose bias gradients differ in the last bit from the unit-by-unit one, so one
    program for all is the only way zero3 gives `single`'s bits."""
    shapes = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), problem.params)
    return unit_vjp.unit_value_and_grad(problem, shapes, gather_leaf or (lambda p, shape: p), reshard_after_forward,
                                        ties=gather_leaf is not None,  # nothing gathered: no copy of each parameter
                                        fold=True)  # weight gradients in their own layout: models/dot_fold.py


def shard_values_of(problem, gather_leaf=None, reshard_after_forward: bool = True):
    """`(params, x, y, accum, k) -> (loss, gradient)`: this device's partial sums over its k shards of
    every micro-batch (`local_partials`), each shard by `unit_value_and_grad`, streamed through the
    tree (`streamed_partials`); a model with running statistics (BatchNorm couples the shards):
    `batchnorm.shard_values` on the full parameters (zero3: gathered once per micro-batch, whole),
    stacked, then folded."""
    if problem.state is not None:
        values = bn_shard_values(problem, gather_leaf)
        return lambda params, x, y, accum, k: local_partials(values, params, x, y, accum, k)
    value_and_grad = unit_value_and_grad(problem, gather_leaf, reshard_after_forward)
    return lambda params, x, y, accum, k: streamed_partials(value_and_grad, params, x, y, accum, k)


def bn_shard_values(problem, gather_leaf=None):
    """`(params, xs, ys) -> stacked (losses, gradients)` for a model with BatchNorm: the whole model
    gathered (zero3), then the shards."""
    shapes = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), problem.params)

    def values(params, xs, ys):
        full = jax.tree.map(gather_leaf, params, shapes) if gather_leaf else params
        return batchnorm.shard_values(problem.loss_fn, full, xs, ys)
    return values


def _split(a, accum: int, local_shards: int):
    """Rows of this device -> [A, k, r, ...]: its shares of micro-batches 0..A-1, k shards each."""
    return a.reshape(accum, local_shards, a.shape[0] // (accum * local_shards), *a.shape[1:])


def local_partials(value_and_grad_fn, params, x, y, accum: int, local_shards: int):
    """This device's partial sums (loss, gradient) over its `local_shards` shards of every micro-batch,
    from stacked per-shard values (`value_and_grad_fn(params, xs, ys)`: BatchNorm's): each shard folds
    its micro-batches in order, then the device's subtree. Not divided: see module."""
    xs, ys = _split(x, accum, local_shards), _split(y, accum, local_shards)
    acc = value_and_grad_fn(params, xs[0], ys[0])
    if accum > 1:
        def micro(carry, batch):
            return jax.tree.map(jnp.add, carry, value_and_grad_fn(params, *batch)), None
        acc, _ = lax.scan(micro, acc, (xs[1:], ys[1:]))
    return reduce.tree(acc)


def streamed_partials(value_and_grad, params, x, y, accum: int, local_shards: int):
    """`local_partials` (the same association, the same bits) with one shard's program
    (`value_and_grad(params, x, y)`, fenced) at a time: shard i folds its micro-batches in order, and
    the shards go through the tree as they finish (`reduce.streamed_tree`): log2(k) + 2
    gradient-sized buffers instead of k stacked ones."""
    xs, ys = _split(x, accum, local_shards), _split(y, accum, local_shards)

    def one(j, i):
        return reduce.fenced(value_and_grad, params, xs[j, i], ys[j, i])

    def leaf(i):
        acc = one(0, i)
        if accum > 1:
            def micro(carry, j):
                return jax.tree.map(jnp.add, carry, one(j, i)), None
            acc, _ = lax.scan(micro, acc, jnp.arange(1, accum, dtype=jnp.int32))
        return acc
    like = jax.eval_shape(value_and_grad, *jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                                         (params, xs[0, 0], ys[0, 0])))
    return reduce.streamed_tree(leaf, local_shards, like)


def step_shards(x, shards: int, accum: int, n: int) -> int:
    """S for a step whose device holds `x` (its `accum` micro-batches' rows) on `n` devices; `shards` as given
    (0: the default by work per shard)."""
    return resolve_shards(shards, x.shape[0] * n // accum, n, row_tokens(x.shape, jnp.issubdtype(x.dtype, jnp.integer)))


def step_values(partials, params, x, y, opts, n: int, sync):
    """(loss, grads): the canonical global means of this step on a device holding x, y (its rows).
    `partials(params, x, y, accum, k)` gives this device's partial sums over its k shards
    (`shard_values_of`); `sync` adds the devices' partial sums by the tree (None: all shards are here)."""
    shards = step_shards(x, opts.shards, opts.accum, n)
    partial = partials(params, x, y, opts.accum, shards // n)
    total = sync(partial) if sync else partial
    return reduce.finish(total, shards, opts.accum)
