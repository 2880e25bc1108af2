"""Causal self-attention under `--kernels fused` (jaxdp/core/kernels.py): `jax.nn.dot_product_attention`,
as JAX users call it. On NVIDIA GPUs JAX picks cuDNN's fused attention for bf16 and fp16 (no fp32 mode),
elsewhere XLA's own composition; `implementation(...)` fixes the choice (`--target h100` asks for cuDNN).
The mirrored attention stays written out in each model (gpt.py, gpt2.py, llama.py), the torch twins' op
order. torch_ref/models/attention.py is the twin (`F.scaled_dot_product_attention`).
"""
from __future__ import annotations

import contextlib

import jax

_CHOSEN: list = [None]  # None: JAX's choice; "xla" or "cudnn"


@contextlib.contextmanager
def implementation(name: str | None):
    """Within the block, `fused` asks `jax.nn.dot_product_attention` for `name` ("xla", "cudnn", None)."""
    before = _CHOSEN[0]
    _CHOSEN[0] = name
    try:
        yield
    finally:
        _CHOSEN[0] = before


def fused(q, k, v):
    """Causal attention of q [b, t, h, d] over k, v [b, t, g, d] (g divides h: grouped-query, query head j
    reads key/value head j // (h / g), as transformers' repeat_kv), scale 1 / sqrt(d); [b, t, h, d] out."""
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=_CHOSEN[0])



@contextlib.contextmanager
def chosen(module, kernels: str):
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
