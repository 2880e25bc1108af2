"""Canonical BatchNorm by segments (jaxdp/canonical/batchnorm.py) on models as users write them: a plain
stack and one with a skip connection around its BatchNorms (the layers before a segment then run again
inside it). In float64 the sum of the shards' gradients is BatchNorm's gradient over the whole batch; with
the statistics' share left out it is not (torch_ref's twin: tests/torch_ref/canonical/test_torch_segments.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxdp.canonical import batchnorm
from jaxdp.models import from_module
from jaxdp.models.cnn import BatchNorm

SHARDS, ROWS = 4, 8


class Stack(nnx.Module):
    def __init__(self, skip: bool, rngs: nnx.Rngs):
        kw = dict(param_dtype=jnp.float64, dtype=jnp.float64)
        self.skip = skip
        self.conv1 = nnx.Conv(2, 4, (3, 3), padding="SAME", rngs=rngs, **kw)
        self.bn1 = BatchNorm(4, mode="sync", **kw)
        self.conv2 = nnx.Conv(4, 4, (3, 3), padding="SAME", rngs=rngs, **kw)
        self.bn2 = BatchNorm(4, mode="sync", **kw)
        self.head = nnx.Linear(4, 3, rngs=rngs, **kw)

    def __call__(self, x):
        h = self.conv1(x)
        out = self.bn2(self.conv2(nnx.relu(self.bn1(h))))
        out = nnx.relu(out + h if self.skip else out)  # a ResNet block's skip: around both BatchNorms
        return self.head(out.mean(axis=(1, 2)))


def _grads(skip: bool):
    problem = from_module(Stack(skip, nnx.Rngs(0)),
                          lambda logits, y: optax.softmax_cross_entropy_with_integer_labels(logits, y).mean())
    loss_fn, params = problem.loss_fn, problem.params
    kx, ky = jax.random.split(jax.random.key(1))
    x = jax.random.normal(kx, (SHARDS * ROWS, 5, 5, 2), jnp.float64)
    y = jax.random.randint(ky, (SHARDS * ROWS,), 0, 3)
    native = jax.grad(loss_fn)(params, x, y)
    xs, ys = (a.reshape(SHARDS, ROWS, *a.shape[1:]) for a in (x, y))
    _, grads = jax.jit(lambda p, xs, ys: batchnorm.shard_values(loss_fn, p, xs, ys))(params, xs, ys)
    canonical = jax.tree.map(lambda g: g.sum(0) / SHARDS, grads)
    flat = [np.ravel(a) for a in jax.tree.leaves((canonical, native))]
    half = len(flat) // 2
    return np.concatenate(flat[:half]), np.concatenate(flat[half:])


@pytest.mark.parametrize("skip", [False, True])
def test_segments_give_batchnorms_gradient(skip):
    canonical, native = _grads(skip)
    assert np.isfinite(canonical).all()
    assert np.max(np.abs(canonical - native)) / np.max(np.abs(native)) <= 1e-12


def test_without_the_statistics_share_the_gradient_is_off(monkeypatch):
    monkeypatch.setattr(batchnorm, "share", lambda z, mean, c: 0 * z)
    canonical, native = _grads(True)
    assert np.max(np.abs(canonical - native)) / np.max(np.abs(native)) > 1e-6
