"""Causal self-attention as JAX users write it (`--kernels fused`): one call to `jax.nn.dot_product_attention`.

`fused(q, k, v)` takes and gives [batch, tokens, heads, head dim]; k and v may have fewer heads than q (grouped-query
attention: each key/value head serves n_head / n_kv_head query heads). Which kernel computes it is JAX's
`implementation=` argument, read from `implementation(...)` here at trace time: None (the default) lets JAX
choose (XLA's attention in JAX 0.10: its `None` case is XLA's, "cuDNN later"; `fused` itself asks for cuDNN
on a GPU in bf16, `on_gpu`), "cudnn" asks for cuDNN's fused
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
    """Causal attention of q [b, t, h, d] over k, v [b, t, h_kv, d], scaled by 1 / sqrt(d): [b, t, h, d]. Query
    head j reads key/value head j // (h / h_kv), as transformers' repeat_kv. On a GPU with no implementation
    chosen, bf16 takes cuDNN's attention (`on_gpu`), XLA's where cuDNN refuses the shape."""
    name = chosen()
    if name is None and on_gpu(q):
        try:
            return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
        except NotImplementedError:  # a shape cuDNN cannot take (a head dim over 128, not a multiple of 8)
            name = "xla"
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=name)


def on_gpu(q) -> str | None:
    """JAX's choice for `q` on this backend when none is chosen: cuDNN for bf16/fp16 on a GPU (JAX 0.10's own
    None is XLA's attention everywhere), else XLA's."""
    import jax.numpy as jnp

    if jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16):
        return "cudnn"
    return None


@contextlib.contextmanager
def switched(module, kernels: str):
    """Within the block, every submodule of `module` that offers the choice (a `kernels` attribute: the
    attention of gpt, gpt2 and llama) has `kernels`; restored after (a Problem built inside keeps it: the
    graph definition is taken then). A user's own attention is theirs to write."""
    from flax import nnx

    offered = [sub for _, sub in nnx.iter_graph(module)
               if isinstance(sub, nnx.Module) and getattr(sub, "kernels", None) in ("mirrored", "fused")]
    before = [sub.kernels for sub in offered]
    for sub in offered:
        sub.kernels = kernels
    try:
        yield len(offered)
    finally:
        for sub, was in zip(offered, before, strict=True):
            sub.kernels = was
