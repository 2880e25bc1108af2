"""Canonical BatchNorm statistics (docs/CANONICAL.md, "BatchNorm statistics"): a model whose sync
BatchNorm couples the shards of a micro-batch, with the same bits on every N dividing S.

Each shard runs the model with the statistics *given* (`models.given`): its BatchNorm layers
normalise with them and report their rows' partial sums and inputs. The statistics are the tree (`total`: the
device's subtree, then across devices) of those partial sums, layer by layer (L forward passes, each
shard's input to the layer kept for its variance's partial sum);
each shard's gradient is its own backward with the statistics held, plus the statistics' share,
propagated back through them layer by layer in reverse (one vector-Jacobian product of a layer's two
partial sums per shard: L in all; the variance's share through the mean, -2 sum (z - mean) times its
cotangent, is zero over the micro-batch, so it is left out), the cotangents of the statistics summed over
all shards by the same tree. Every per-shard computation is
one program on the shard's rows and replicated values (`per_shard`: lax.map fenced by optimization
barriers, as `reduce.shard_values`), every cross-shard sum is the tree: nothing depends on N.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ..core.config import ConfigError
from ..devices import AXIS
from ..models import given as given_mod
from . import reduce


def bound_axis() -> str | None:
    """AXIS inside a shard_map / pmap over it, else None (`single`: every shard is here)."""
    try:
        lax.axis_size(AXIS)
    except NameError:
        return None
    return AXIS


def total(stacked, axis: str | None):
    """The tree over all S shards of per-shard values stacked [k, ...] on each device: every device."""
    local = reduce.tree(stacked)
    return local if axis is None else reduce.combine(local, axis)


def per_shard(fn, xs, ys):
    """`fn(x, y)` for each shard, one at a time by the same program, fenced (`reduce.shard_values`)."""
    return reduce.shard_values(lambda _, x, y: fn(x, y), (), xs, ys)


def shard_program(loss_fn, shards: int):
    """F(params, stats, x, y) -> (loss, partials, inputs): one shard's loss with BatchNorm's statistics given,
    each layer's partial sums and its input z."""
    def run(params, stats, x, y):
        with given_mod.given(stats, shards) as record:
            loss = loss_fn(params, x, y)
        return loss, tuple(record.partials), tuple(record.inputs)
    return run


def layout(loss_fn, params, x, y, shards: int) -> list[int]:
    """The micro-batch's count of each BatchNorm layer, in call order (one abstract trace)."""
    with given_mod.given(None, shards) as record:
        jax.eval_shape(lambda *args: loss_fn(*args), params, x, y)  # a fresh function: no cached trace
    if not record.counts:
        raise ConfigError("reduction='canonical' with running statistics needs jaxdp's BatchNorm "
                         "(jaxdp.models.cnn.BatchNorm), which takes canonical statistics; use reduction='native'")
    return record.counts


class Micro(NamedTuple):
    """One micro-batch on this device: the shard program, S, the layers' counts, the (full) parameters,
    the k shards' rows stacked [k, rows, ...], and the device axis (None: every shard is here)."""
    program: Callable
    shards: int
    counts: list
    params: dict
    xs: jax.Array
    ys: jax.Array
    axis: str | None


def micro(loss_fn, params, xs, ys) -> Micro:
    axis = bound_axis()
    shards = xs.shape[0] * (1 if axis is None else lax.axis_size(axis))
    counts = layout(loss_fn, params, xs[0], ys[0], shards)
    return Micro(shard_program(loss_fn, shards), shards, counts, params, xs, ys, axis)


def statistics(run: Micro):
    """[(mean, var)] per layer, layer by layer: one pass over the shards gives each shard's sum z and its z
    (kept: this device's activations at the layer), the tree of the sums / count the mean; then each kept z's
    squared deviations from it, by the tree / count, the variance."""
    stats: list = [None] * len(run.counts)  # None: not yet known (a placeholder in the forward, unused)
    for layer, count in enumerate(run.counts):
        def first(x, y, layer=layer, held=tuple(stats)):
            _, partials, inputs = run.program(run.params, held, x, y)
            return partials[layer][0], inputs[layer]
        sums, zs = per_shard(first, run.xs, run.ys)
        mean = total(sums, run.axis) / count
        squares = per_shard(lambda z, _, mean=mean: given_mod.squared_deviations(z - mean), zs, run.ys)
        stats[layer] = (mean, total(squares, run.axis) / count)
    return tuple(stats)


def shard_values(loss_fn, params, xs, ys):
    """`reduce.shard_values` for a model with BatchNorm: (losses [k], gradients [k, ...]) of the k
    shards here, each gradient with the statistics' share, of one micro-batch (module docstring)."""
    run = micro(loss_fn, params, xs, ys)
    stats = statistics(run)

    def direct(x, y):
        (loss, partials), vjp = jax.vjp(lambda p, s: run.program(p, s, x, y)[:2], params, stats)
        return (loss, *vjp((jnp.ones_like(loss), jax.tree.map(jnp.zeros_like, partials))))

    losses, grads, held = per_shard(direct, xs, ys)
    return losses, through_statistics(run, stats, grads, total(held, run.axis))


def through_statistics(run: Micro, stats, grads, cotangent):
    """The shards' gradients `grads` plus the statistics' share: their cotangent (summed over all shards)
    propagated back through each layer's two partial sums at once, last layer first (module docstring)."""
    for layer in reversed(range(len(run.counts))):
        c = tuple(v / run.counts[layer] for v in cotangent[layer])  # (mean's, variance's)

        def through(x, y, layer=layer, c=c):
            _, vjp = jax.vjp(lambda p, s: run.program(p, s, x, y)[1][layer], run.params, stats)
            return vjp(c)

        g, h = per_shard(through, run.xs, run.ys)
        grads = jax.tree.map(jnp.add, grads, g)
        cotangent = jax.tree.map(jnp.add, cotangent, total(h, run.axis))
    return grads


def running_statistics(problem, params, state, x, accum: int, local_shards: int):
    """The running statistics after this step's micro-batches, in order, each from its canonical
    statistics (`statistics`), updated as the model updates them (`problem.update_state` with the
    statistics given). x: this device's rows, as the gradient step gets them."""
    xs = x.reshape(accum, local_shards, x.shape[0] // (accum * local_shards), *x.shape[1:])

    def forward(p, rows, _):  # the model's outputs, not a loss: no labels needed
        problem.apply(p, rows)
        return jnp.zeros(())

    def one(state, rows):
        run = micro(forward, params, rows, rows)  # labels unread
        with given_mod.given(statistics(run), run.shards):
            return problem.update_state(params, state, rows[0]), None

    state, _ = lax.scan(one, state, xs)
    return state
