"""`jaxdp.models.loop_conv`: the cnn's convolution under canonical BatchNorm. Its gradient is
`lax.conv_general_dilated`'s (float64, to 1e-12); inside a loop body every convolution XLA:CPU
compiles is in the order its Eigen kernel takes (the check fails on lax's own gradient); outside
`given` the hook is `lax.conv_general_dilated` itself (native runs unchanged, bit for bit)."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxdp.models import given, loop_conv

CANONICAL = "b01f_01io->b01f"


def _inputs(dtype):
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.normal(size=(6, 8, 8, 3)), dtype), jnp.asarray(rng.normal(size=(3, 3, 3, 4)), dtype))


def _plain(x, k):
    return lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=loop_conv.DIMENSIONS)


def _loss(conv):
    return lambda x, k: jnp.sum(jnp.sin(conv(x, k)))


def test_its_gradient_is_the_convolutions_gradient():
    with jax.enable_x64(True):
        x, k = _inputs(jnp.float64)
        want = jax.grad(_loss(_plain), (0, 1))(x, k)
        got = jax.grad(_loss(loop_conv.conv_same), (0, 1))(x, k)
        assert np.array_equal(_plain(x, k), loop_conv.conv_same(x, k))
        for w, g in zip(want, got, strict=True):
            assert np.max(np.abs(w - g)) <= 1e-12 * np.max(np.abs(w))


def _loop_labels(conv) -> set[str]:
    """The dimension orders of the convolutions XLA:CPU compiles for conv's gradient in a lax.map body."""
    x, k = _inputs(jnp.float32)
    xs = jnp.stack([x, x + 1])
    text = jax.jit(lambda k, xs: lax.map(lambda x: jax.grad(_loss(conv), (0, 1))(x, k), xs)).lower(k, xs).compile()
    return set(re.findall(r"dim_labels=([a-z0-9_>-]+)", text.as_text()))


def test_in_a_loop_every_convolution_is_in_eigens_order():
    assert _loop_labels(loop_conv.conv_same) == {CANONICAL}
    assert _loop_labels(_plain) - {CANONICAL}  # lax's own gradient: not (what made the cnn slow)


def test_the_hook_is_lax_outside_canonical_batchnorm():
    x, k = _inputs(jnp.float32)
    dims = lax.conv_dimension_numbers(x.shape, k.shape, loop_conv.DIMENSIONS)
    hook = loop_conv.conv_general_dilated
    assert hook(x, k, (1, 1), "SAME", dimension_numbers=dims) is not None
    def jaxpr(strides=(1, 1)):  # a fresh function each time: no cached trace
        return str(jax.make_jaxpr(lambda x, k: hook(x, k, strides, "SAME", dimension_numbers=dims))(x, k))
    assert "custom_vjp" not in jaxpr()
    with given.given(None, 1):
        assert "custom_vjp" in jaxpr()
        assert "custom_vjp" not in jaxpr((2, 2))  # not the cnn's convolution: lax's
