"""`gpt`: a small decoder-only transformer (pre-norm blocks, causal attention, GELU MLP).

Written out by hand so that the torch mirror can follow it operation by operation (`kernels="fused"`:
`jax.nn.dot_product_attention` instead, attention.py): token + position embeddings, `n_layer` blocks of
LayerNorm -> causal self-attention -> residual, LayerNorm -> MLP(4x, exact GELU) -> residual, a final
LayerNorm and an untied head. LayerNorm epsilon is 1e-5, as in torch.nn.LayerNorm. The qkv projection has no
bias. FSDP units: the two embeddings, each block, and the final LayerNorm with the head.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from . import attention, units

LN_EPS = 1e-5


class Attention(nnx.Module):
    def __init__(self, d_model, n_head, kernels="mirrored", **kw):
        self.n_head, self.kernels = n_head, kernels
        # No bias on qkv: the key bias has an identically zero gradient (softmax is shift-invariant),
        # so its "gradient" is pure roundoff, which Adam's g / (sqrt(v) + eps) amplifies ~1e8-fold.
        self.qkv = nnx.Linear(d_model, 3 * d_model, use_bias=False, **kw)
        self.proj = nnx.Linear(d_model, d_model, **kw)

    def __call__(self, x):
        b, t, d = x.shape
        h = self.n_head
        q, k, v = jnp.split(self.qkv(x), 3, axis=-1)
        q, k, v = (a.reshape(b, t, h, d // h) for a in (q, k, v))
        if self.kernels == "fused":
            return self.proj(attention.fused(q, k, v).reshape(b, t, d))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(d // h).astype(x.dtype)
        causal = jnp.tril(jnp.ones((t, t), dtype=bool))
        scores = jnp.where(causal, scores.astype(jnp.float32 if x.dtype == jnp.bfloat16 else x.dtype), -jnp.inf)
        weights = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
        return self.proj(out)


class MLPBlock(nnx.Module):
    def __init__(self, d_model, **kw):
        self.fc = nnx.Linear(d_model, 4 * d_model, **kw)
        self.proj = nnx.Linear(4 * d_model, d_model, **kw)

    def __call__(self, x):
        return self.proj(jax.nn.gelu(self.fc(x), approximate=False))


class Block(nnx.Module):
    def __init__(self, d_model, n_head, kernels="mirrored", **kw):
        self.ln1 = nnx.LayerNorm(d_model, epsilon=LN_EPS, **kw)
        self.attn = Attention(d_model, n_head, kernels, **kw)
        self.ln2 = nnx.LayerNorm(d_model, epsilon=LN_EPS, **kw)
        self.mlp = MLPBlock(d_model, **kw)

    def __call__(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nnx.Module):
    def __init__(self, *, vocab, seq_len, n_layer, n_head, d_model, param_dtype, dtype, rngs: nnx.Rngs,
                 kernels="mirrored"):
        kw = dict(param_dtype=param_dtype, dtype=dtype, rngs=rngs)
        self.tok_embed = nnx.Embed(vocab, d_model, **kw)
        self.pos_embed = nnx.Embed(seq_len, d_model, **kw)
        self.blocks = nnx.List([Block(d_model, n_head, kernels, **kw) for _ in range(n_layer)])
        self.ln_f = nnx.LayerNorm(d_model, epsilon=LN_EPS, **kw)
        self.head = nnx.Linear(d_model, vocab, **kw)

    def unit_specs(self) -> list[units.UnitSpec]:
        return [units.UnitSpec("embed", (("tok_embed",), ("pos_embed",)), embed),
                *(units.UnitSpec(f"blocks/{i}", (("blocks", i),), block) for i in range(len(self.blocks))),
                units.UnitSpec("head", (("ln_f",), ("head",)), head)]

    def __call__(self, tokens):
        return units.run(self, tokens)


def embed(tok_embed, pos_embed, tokens):
    return tok_embed(tokens) + pos_embed(jnp.arange(tokens.shape[1]))


def block(module, x):
    return module(x)


def head(ln_f, linear, x):
    return linear(ln_f(x))
