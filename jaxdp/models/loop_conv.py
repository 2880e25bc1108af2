"""A stride-1 "SAME" 2-D convolution (NHWC, HWIO) whose backward XLA:CPU runs fast inside a loop:
the cnn's convolution while canonical BatchNorm runs (`models.given`).

Why: XLA:CPU hands a convolution to its Eigen kernel only in a canonical dimension order, and its
`ConvCanonicalization` pass rewrites convolutions into that order in the entry computation only. The
gradients of `lax.conv_general_dilated` (the kernel's: batch and feature swapped; the input's: the
kernel's in/out swapped) are not in that order, so inside a `lax.map` body (canonical BatchNorm's
shards) they ran as naive loop nests (measured: the cnn's per-shard backward 7-10x slower than the
same program outside a loop). Here the backward is written in the canonical order itself: the
input's gradient a convolution of the output's gradient with the flipped kernel (HWIO), the kernel's
gradient one matrix product per kernel offset over the shifted input's rows.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from . import given

DIMENSIONS = ("NHWC", "HWIO", "NHWC")


def _forward(x, kernel):
    return lax.conv_general_dilated(x, kernel, (1, 1), "SAME", dimension_numbers=DIMENSIONS)


def _pads(kernel):
    return [((k - 1) // 2, k // 2) for k in kernel.shape[:2]]  # "SAME" at stride 1


@jax.custom_vjp
def conv_same(x, kernel):
    """`lax.conv_general_dilated(x, kernel, (1, 1), "SAME")`, NHWC x HWIO (module docstring)."""
    return _forward(x, kernel)


def _fwd(x, kernel):
    return _forward(x, kernel), (x, kernel)


def _bwd(residuals, g):
    x, kernel = residuals
    kh, kw = kernel.shape[:2]
    flipped = jnp.swapaxes(kernel[::-1, ::-1], 2, 3)  # HWIO with I and O swapped: the transpose
    back = [(k - 1 - lo, k - 1 - hi) for k, (lo, hi) in zip((kh, kw), _pads(kernel), strict=True)]
    dx = lax.conv_general_dilated(g, flipped, (1, 1), back, dimension_numbers=DIMENSIONS)
    padded = jnp.pad(x, [(0, 0), *_pads(kernel), (0, 0)])
    h, w = x.shape[1:3]
    rows = g.reshape(-1, g.shape[-1])
    dk = jnp.stack([jnp.stack([padded[:, a:a + h, b:b + w, :].reshape(-1, x.shape[-1]).T @ rows
                               for b in range(kw)]) for a in range(kh)])
    return dx.astype(x.dtype), dk.astype(kernel.dtype)


conv_same.defvjp(_fwd, _bwd)


def conv_general_dilated(lhs, rhs, window_strides, padding, **kwargs):
    """`nnx.Conv`'s `conv_general_dilated` hook: under canonical BatchNorm (`given.current()`), `conv_same`
    for a stride-1 "SAME" NHWC x HWIO convolution (the cnn's); `lax.conv_general_dilated` otherwise
    (native runs are untouched)."""
    plain = (given.current() is not None and lhs.ndim == 4 and tuple(window_strides) == (1, 1) and padding == "SAME"
             and kwargs.get("feature_group_count", 1) == 1 and kwargs.get("precision") is None
             and all(d is None or tuple(d) == (1, 1) for d in (kwargs.get("lhs_dilation"), kwargs.get("rhs_dilation")))
             and kwargs.get("dimension_numbers") == lax.conv_dimension_numbers(lhs.shape, rhs.shape, DIMENSIONS))
    if not plain:
        return lax.conv_general_dilated(lhs, rhs, window_strides, padding, **kwargs)
    return conv_same(lhs, rhs)
