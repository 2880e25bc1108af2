"""`gpt2`: GPT-2's architecture in Flax NNX, named as GPT-2's checkpoints name it.

Learned token (`wte`) and position (`wpe`) embeddings; `n_layer` blocks `h/<i>` of pre-LayerNorm (`ln_1`, eps
1e-5) -> causal self-attention (fused `attn/c_attn` with bias, `attn/c_proj`) -> residual (`kernels="fused"`:
`jax.nn.dot_product_attention`, attention.py), `ln_2` -> MLP (`mlp/c_fc`, 4x, GELU tanh, `mlp/c_proj`) ->
residual; a final `ln_f`; the output head is `wte` itself (tied: logits = h @ wte.T), so one parameter is used
twice and its gradient is the sum of both uses. No dropout. Initialisation as GPT-2: normal(0.02) weights, the
residual projections (`c_proj`) normal(0.02 / sqrt(2 n_layer)), zero biases, unit LayerNorm scales.

FSDP units (`unit_specs`): the embeddings, each block, and `ln_f` with the head. `wte` is listed by both the
first unit and the last: a parameter listed by several units is *shared*, owned by the root and gathered once
for all its uses (`jaxdp/models/unit_vjp.py`), as torch FSDP2 does with a tied weight left to the root module.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from . import attention, units

LN_EPS = 1e-5
VOCAB = 50304  # GPT-2's 50257 tokens padded to a multiple of 64 (`--preset gpt2-124m`, `--data tokens`)


def _linear(d_in, d_out, std, **kw):
    return nnx.Linear(d_in, d_out, kernel_init=nnx.initializers.normal(std), bias_init=nnx.initializers.zeros, **kw)


class CausalSelfAttention(nnx.Module):
    def __init__(self, d_model, n_head, proj_std, kernels="mirrored", **kw):
        self.n_head, self.kernels = n_head, kernels
        self.c_attn = _linear(d_model, 3 * d_model, 0.02, **kw)  # q | k | v, each heads-contiguous
        self.c_proj = _linear(d_model, d_model, proj_std, **kw)

    def __call__(self, x):
        b, t, d = x.shape
        h = self.n_head
        q, k, v = (a.reshape(b, t, h, d // h) for a in jnp.split(self.c_attn(x), 3, axis=-1))
        if self.kernels == "fused":
            return self.c_proj(attention.fused(q, k, v).reshape(b, t, d))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(d // h).astype(x.dtype)
        scores = scores.astype(jnp.float32 if x.dtype == jnp.bfloat16 else x.dtype)  # bf16: softmax in fp32
        scores = jnp.where(jnp.tril(jnp.ones((t, t), dtype=bool)), scores, -jnp.inf)
        weights = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
        return self.c_proj(jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d))


class MLP(nnx.Module):
    def __init__(self, d_model, proj_std, **kw):
        self.c_fc = _linear(d_model, 4 * d_model, 0.02, **kw)
        self.c_proj = _linear(4 * d_model, d_model, proj_std, **kw)

    def __call__(self, x):
        return self.c_proj(jax.nn.gelu(self.c_fc(x), approximate=True))


class Block(nnx.Module):
    def __init__(self, d_model, n_head, proj_std, kernels="mirrored", **kw):
        self.ln_1 = nnx.LayerNorm(d_model, epsilon=LN_EPS, **kw)
        self.attn = CausalSelfAttention(d_model, n_head, proj_std, kernels, **kw)
        self.ln_2 = nnx.LayerNorm(d_model, epsilon=LN_EPS, **kw)
        self.mlp = MLP(d_model, proj_std, **kw)

    def __call__(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nnx.Module):
    def __init__(self, *, vocab, seq_len, n_layer, n_head, d_model, param_dtype, dtype, rngs: nnx.Rngs,
                 kernels="mirrored"):
        kw = dict(param_dtype=param_dtype, dtype=dtype, rngs=rngs)
        embed_init = nnx.initializers.normal(0.02)
        proj_std = 0.02 / math.sqrt(2 * n_layer)
        self.wte = nnx.Embed(vocab, d_model, embedding_init=embed_init, **kw)
        self.wpe = nnx.Embed(seq_len, d_model, embedding_init=embed_init, **kw)
        self.h = nnx.List([Block(d_model, n_head, proj_std, kernels, **kw) for _ in range(n_layer)])
        self.ln_f = nnx.LayerNorm(d_model, epsilon=LN_EPS, **kw)

    def unit_specs(self) -> list[units.UnitSpec]:
        return [units.UnitSpec("embed", (("wte",), ("wpe",)), embed),
                *(units.UnitSpec(f"h/{i}", (("h", i),), block) for i in range(len(self.h))),
                units.UnitSpec("head", (("ln_f",), ("wte",)), tied_head)]

    def __call__(self, tokens):
        return units.run(self, tokens)


def embed(wte, wpe, tokens):
    return wte(tokens) + wpe(jnp.arange(tokens.shape[1]))


def block(module, x):
    return module(x)


def tied_head(ln_f, wte, x):
    """The output head is the token embedding, transposed: logits = ln_f(x) @ wte.T."""
    return wte.attend(ln_f(x))
