"""Canonical BatchNorm statistics (docs/CANONICAL.md, "BatchNorm statistics"): a model whose sync
BatchNorm couples the shards of a micro-batch, with the same bits on every N dividing S.

Each shard runs the model with the statistics *given* (`models.given`), cut into segments at its
BatchNorm layers: segment j runs from layer j-1's input (given in place of the forward's own) to layer
j's input, the last to the loss (`segment`). Forward (`forward`): layer by layer, each shard's input to
the layer from its input to the one before, kept; the statistics are the tree (`total`: the device's
subtree, then across devices) of their partial sums. Backward (`shard_values`): each segment's
vector-Jacobian product, last first, per shard; before segment j's, the statistics' cotangents so far
are summed over all shards by the same tree and their share (`share`) added to the cotangent of layer
j's input (the variance's share through the mean, -2 sum (z - mean) times its cotangent, is zero over the
micro-batch, so it is left out). A shard's forward runs twice (the statistics', then each segment's again
in its product) and its backward once. Every per-shard computation is one program on the shard's rows
and replicated values (`per_shard`: lax.map fenced by optimization barriers, as `reduce.shard_values`),
every cross-shard sum is the tree: nothing depends on N.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ..core.run.config import ConfigError
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
    """F(params, stats, x, y, inputs=None) -> (loss, inputs): one shard's loss with BatchNorm's statistics
    given (and layer l's input where `inputs` has one: a segment starting there) and each layer's input z."""
    def run(params, stats, x, y, given_inputs=None):
        with given_mod.given(stats, shards, given_inputs) as record:
            loss = loss_fn(params, x, y)
        return loss, tuple(record.inputs)
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


def segment(run: Micro, j: int):
    """Segment j of one shard's forward, a function of (params, stats, z, x, y): from layer j-1's input z
    (j = 0: from the data) to layer j's input (j = L: to the loss); what comes before layer j-1 is
    unused (`given_mod.given`'s inputs)."""
    last = len(run.counts)

    def fn(params, stats, z, x, y):
        loss, inputs = run.program(params, stats, x, y, None if j == 0 else {j - 1: z})
        return loss if j == last else inputs[j]
    return fn


def forward(run: Micro):
    """(stats, zs): [(mean, var)] per layer and each layer's input z for this device's shards (stacked
    [k, ...]), segment by segment: each shard's z of layer l from its z of layer l-1, the tree of its sums
    / count the mean, then the tree of its squared deviations from it / count the variance."""
    stats: list = [None] * len(run.counts)  # None: not yet known (a placeholder in the forward, unused)
    zs: list = []
    for layer, count in enumerate(run.counts):
        def first(x, yz, layer=layer, held=tuple(stats)):
            z = segment(run, layer)(run.params, held, yz[1], x, yz[0])
            return z.sum(tuple(range(z.ndim - 1))), z
        sums, z = per_shard(first, run.xs, (run.ys, zs[-1] if zs else run.ys))
        mean = total(sums, run.axis) / count
        squares = per_shard(lambda z, _, mean=mean: given_mod.squared_deviations(z - mean), z, run.ys)
        stats[layer] = (mean, total(squares, run.axis) / count)
        zs.append(z)
    return tuple(stats), zs


def statistics(run: Micro):
    """[(mean, var)] per layer of one micro-batch (`forward`)."""
    return forward(run)[0]


def shard_values(loss_fn, params, xs, ys):
    """`reduce.shard_values` for a model with BatchNorm: (losses [k], gradients [k, ...]) of the k
    shards here, each gradient with the statistics' share, of one micro-batch (module docstring): the
    forward segment by segment (`forward`), then each segment's vector-Jacobian product, last first, the
    statistics' cotangent summed over all shards by the tree before the segment that made them."""
    run = micro(loss_fn, params, xs, ys)
    stats, zs = forward(run)
    last = len(run.counts)
    losses, grads, held, dz = None, None, None, None
    for j in reversed(range(last + 1)):
        c = None if j == last else tuple(v / run.counts[j] for v in total(held[j], run.axis))

        def back(x, rest, j=j, c=c):
            y, z_in, z_out, d_out = rest
            wrt = (params, stats) if j == 0 else (params, stats, z_in)
            out, vjp = jax.vjp(lambda p, s, *z: segment(run, j)(p, s, *(z or (None,)), x, y), *wrt)
            d = jnp.ones_like(out) if j == last else d_out + share(z_out, stats[j][0], c)
            return (out, *vjp(d)) if j == last else vjp(d)
        rest = (ys, zs[j - 1] if j else ys, zs[j] if j < last else ys, ys if dz is None else dz)
        values = per_shard(back, xs, rest)
        if j == last:
            losses, values = values[0], values[1:]
        g, h, *dz = values
        dz = dz[0] if dz else None
        grads = g if grads is None else jax.tree.map(jnp.add, grads, g)
        held = h if held is None else jax.tree.map(jnp.add, held, h)
    return losses, grads


def share(z, mean, c):
    """The statistics' share of layer input z's cotangent: the vector-Jacobian product of the layer's partial
    sums (sum z, sum (z - mean)^2), mean held, with c = their cotangents over all shards / count (the
    variance's share through the mean, -2 sum (z - mean) c_var, is zero over the micro-batch: left out)."""
    _, vjp = jax.vjp(lambda z: (z.sum(tuple(range(z.ndim - 1))), given_mod.squared_deviations(z - mean)), z)
    return vjp(c)[0]


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
