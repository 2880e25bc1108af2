"""BatchNorm with *given* statistics: the shard program of canonical BatchNorm (docs/CANONICAL.md,
"BatchNorm statistics").

Inside `given(stats, shards)`, every BatchNorm layer (jaxdp/models/cnn.py) normalises with the
statistics it is given, `stats[l] = (mean, var)` for the l-th layer called (None: a placeholder, zeros
and ones), instead of its rows' own, and records its input z (float32 or wider) and the micro-batch's
count; canonical's statistics take their partial sums from those z (jaxdp/canonical/batchnorm.py), so no
layer computes sums nobody reads (torch_ref/models/given.py, the twin, likewise). Its running statistics
are updated from the given ones, with the micro-batch's count (its rows' count x `shards`). `inputs={l: z}`
replaces layer l's input by z (a segment of the forward that starts at layer l: what comes before it is then
unused, and the compiler drops it). Used at trace time only: the context is a Python value, read while JAX
traces the forward.
"""
from __future__ import annotations

from contextlib import contextmanager

import jax.numpy as jnp

_current: list = []  # the innermost active `Given` last


class Given:
    """The given statistics of one forward and what its BatchNorm layers record, in call order."""

    def __init__(self, stats, shards: int, inputs: dict | None = None):
        self.stats, self.shards, self.given_inputs = stats, shards, inputs or {}
        self.inputs: list = []     # per layer: z (canonical's statistics and segments start from it)
        self.counts: list = []     # per layer: the micro-batch's count (rows x H x W over all shards)

    def take(self, xs):
        """(z, mean, var, count) for the next layer on input `xs` (z: `xs`, or the input given for the layer);
        records z and the count."""
        layer = len(self.inputs)
        xs = self.given_inputs.get(layer, xs)
        given = self.stats[layer] if self.stats is not None else None
        channels = (xs.shape[-1],)
        mean, var = given if given is not None else (jnp.zeros(channels, xs.dtype), jnp.ones(channels, xs.dtype))
        self.inputs.append(xs)
        count = xs.size // xs.shape[-1] * self.shards
        self.counts.append(count)
        return xs, mean, var, count


def squared_deviations(centred):
    """sum (z - mean)^2 per channel (the last axis) over every other axis, from z - mean: the variance's partial
    sum (torch_ref/models/given.py's twin)."""
    return jnp.square(centred).sum(tuple(range(centred.ndim - 1)))


@contextmanager
def given(stats, shards: int, inputs: dict | None = None):
    """Run a forward with BatchNorm's statistics given, and inputs where `inputs` has them (module docstring);
    yields the `Given`."""
    record = Given(stats, shards, inputs)
    _current.append(record)
    try:
        yield record
    finally:
        _current.pop()


def current() -> Given | None:
    return _current[-1] if _current else None
