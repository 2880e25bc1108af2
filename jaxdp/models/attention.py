"""Causal self-attention as JAX users write it (`--kernels fused`): one call to `jax.nn.dot_product_attention`.

`fused(q, k, v)` takes and gives [batch, tokens, heads, head dim]; k and v may have fewer heads than q (grouped-query
attention: each key/value head serves n_head / n_kv_head query heads). Which kernel computes it is JAX's
`implementation=` argument, read from `implementation(...)` here at trace time: None (the default) lets JAX
choose (XLA's attention in JAX 0.10: its `None` case is XLA's, "cuDNN later"), "cudnn" asks for cuDNN's fused
(flash) attention, a custom call on NVIDIA GPUs, bf16/fp16 only, "xla" for XLA's einsum-softmax-einsum.
`jaxdp inspect --target` chooses "cudnn" around the lowering of a fused step (jaxdp/analysis/aot.py).
"""
from __future__ import annotations

import contextlib

import jax

IMPLEMENTATIONS = (None, "xla", "cudnn")
_CHOSEN: list[str | None] = [None]  # the innermost `implementation(...)` in force


@contextlib.contextmanager
def implementation(name: str | None):
    """Trace `fused` with JAX's attention implementation `name` inside this block (None: JAX's choice)."""
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {name!r}; valid: {IMPLEMENTATIONS}")
    _CHOSEN.append(name)
    try:
        yield
    finally:
        _CHOSEN.pop()


def chosen() -> str | None:
    return _CHOSEN[-1]


def fused(q, k, v):
    """Causal attention of q [b, t, h, d] over k, v [b, t, h_kv, d], scaled by 1 / sqrt(d): [b, t, h, d]."""
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=chosen())
