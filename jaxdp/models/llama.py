"""`llama`: the Llama architecture in Flax NNX, named as transformers' `LlamaForCausalLM` names it.

A token embedding `embed_tokens` (no position embedding: positions enter through rotary embeddings);
`n_layer` decoder layers `layers/<i>` of RMSNorm (`input_layernorm`, scale only, eps 1e-6) ->
causal grouped-query self-attention (`self_attn/{q,k,v,o}_proj`, rotary on q and k) -> residual,
`post_attention_layernorm` -> SwiGLU MLP (`down_proj(silu(gate_proj(x)) * up_proj(x))`) -> residual;
a final `norm` and an untied `lm_head`. No biases, no dropout. Initialisation as transformers'
`LlamaConfig` (initializer_range 0.02): normal(0.02) for every Linear and the embedding, RMSNorm
scales ones.

Options for the family's variants (same names in torch_ref/models/llama.py; `torch_ref.models.llama.config_kwargs`
reads them from a transformers config): `qkv_bias=True` gives q/k/v_proj a bias (Qwen2; zeros at
init); `tie_embeddings=True` drops `lm_head`, the head being `embed_tokens` transposed (one
parameter, two uses); `rope_theta`, `rms_eps` (defaults 1e4, 1e-6); `padding_idx=p` as torch's
`nn.Embedding(padding_idx=p)`: row p starts at zero and the lookup gives it no gradient (a tied
head's use still does, as in torch). The names are transformers' without its `model.` prefix, so its `model.layers.0.
self_attn.q_proj.weight` is `layers/0/self_attn/q_proj/kernel` here (a Linear weight transposed).

Grouped-query attention: `n_kv_head` divides `n_head`, and query head h reads key/value head
h // (n_head // n_kv_head), as transformers' `repeat_kv`. Rotary embeddings (theta 10000) rotate
the two halves of each head (transformers' `rotate_half`, not interleaved pairs).

Precision: the rotary angles, their cos and sin are computed in the run's precision (float64 in
float64 runs, float32 otherwise: bf16 runs take fp32 angles, then cast cos and sin to bf16), the
same way in torch_ref/models/llama.py, so the two frameworks agree to roundoff in float64. transformers
computes them in float32 whatever the model's dtype (and its RMSNorm and softmax too): docs/LLAMA.md.
bf16: softmax and RMSNorm's statistics in fp32, as gpt2.

FSDP units (`unit_specs`): the embedding, each decoder layer, and `norm` with `lm_head` (tied: `norm`
with `embed_tokens`, which two units then list: shared, owned by the root, so the first unit owns
no parameter of its own; jaxdp/models/unit_vjp.py).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from . import attention, units

RMS_EPS = 1e-6
ROPE_THETA = 10000.0
INIT_STD = 0.02  # transformers' LlamaConfig.initializer_range


def _linear(d_in, d_out, bias=False, **kw):
    return nnx.Linear(d_in, d_out, use_bias=bias, kernel_init=nnx.initializers.normal(INIT_STD),
                      bias_init=nnx.initializers.zeros, **kw)


def _rms_norm(d_model, eps, **kw):
    return nnx.RMSNorm(d_model, epsilon=eps, **kw)


class Embed(nnx.Embed):
    """nnx.Embed with torch's `padding_idx`: that row starts at zero and gets no gradient from the
    lookup (its positions' outputs are constants to autodiff); `attend` (a tied head) is unchanged."""

    def __init__(self, vocab, d_model, *, padding_idx=None, **kw):
        super().__init__(vocab, d_model, embedding_init=nnx.initializers.normal(INIT_STD), **kw)
        self.padding_idx = padding_idx
        if padding_idx is not None:
            self.embedding[...] = self.embedding[...].at[padding_idx].set(0)

    def __call__(self, tokens):
        x = super().__call__(tokens)
        if self.padding_idx is None:
            return x
        return jnp.where((tokens == self.padding_idx)[..., None], jax.lax.stop_gradient(x), x)


def rotary(seq_len: int, head_dim: int, dtype, theta: float = ROPE_THETA):
    """cos, sin of the rotary angles, [seq_len, head_dim]: position p, frequency i < head_dim/2 has angle
    p / theta^(2i / head_dim), repeated for the second half. Angles in float64 for float64 runs, else fp32."""
    angle_dtype = jnp.float64 if dtype == jnp.float64 else jnp.float32
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=angle_dtype) / head_dim))
    angles = jnp.arange(seq_len, dtype=angle_dtype)[:, None] * inv_freq[None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def rotate_half(x):
    """[x1 | x2] -> [-x2 | x1] over the last axis (the head dimension split in two halves)."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def apply_rotary(x, cos, sin):
    """x [b, t, heads, head_dim] rotated by position: x cos + rotate_half(x) sin."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


class Attention(nnx.Module):
    def __init__(self, d_model, n_head, n_kv_head, qkv_bias, rope_theta, kernels="mirrored", **kw):
        self.n_head, self.n_kv_head, self.rope_theta, self.kernels = n_head, n_kv_head, rope_theta, kernels
        head_dim = d_model // n_head
        self.q_proj = _linear(d_model, n_head * head_dim, qkv_bias, **kw)
        self.k_proj = _linear(d_model, n_kv_head * head_dim, qkv_bias, **kw)
        self.v_proj = _linear(d_model, n_kv_head * head_dim, qkv_bias, **kw)
        self.o_proj = _linear(n_head * head_dim, d_model, **kw)

    def __call__(self, x):
        b, t, d = x.shape
        h, g = self.n_head, self.n_kv_head
        hd, rep = d // h, h // g
        cos, sin = rotary(t, hd, x.dtype, self.rope_theta)
        q = apply_rotary(self.q_proj(x).reshape(b, t, h, hd), cos, sin)
        k = apply_rotary(self.k_proj(x).reshape(b, t, g, hd), cos, sin)
        v = self.v_proj(x).reshape(b, t, g, hd)
        if self.kernels == "fused":
            return self.o_proj(attention.fused(q, k, v).reshape(b, t, d))
        q = q.reshape(b, t, g, rep, hd)  # query head j = kv group j // rep, member j % rep (repeat_kv's order)
        scores = jnp.einsum("bqgrd,bkgd->bgrqk", q, k) * hd ** -0.5
        scores = scores.astype(jnp.float32 if x.dtype == jnp.bfloat16 else x.dtype)  # bf16: softmax in fp32
        scores = jnp.where(jnp.tril(jnp.ones((t, t), dtype=bool)), scores, -jnp.inf)
        weights = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
        return self.o_proj(jnp.einsum("bgrqk,bkgd->bqgrd", weights, v).reshape(b, t, d))


class MLP(nnx.Module):
    def __init__(self, d_model, d_ff, **kw):
        self.gate_proj = _linear(d_model, d_ff, **kw)
        self.up_proj = _linear(d_model, d_ff, **kw)
        self.down_proj = _linear(d_ff, d_model, **kw)

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    def __init__(self, d_model, n_head, n_kv_head, d_ff, *, qkv_bias, rope_theta, rms_eps, kernels="mirrored", **kw):
        self.input_layernorm = _rms_norm(d_model, rms_eps, **kw)
        self.self_attn = Attention(d_model, n_head, n_kv_head, qkv_bias, rope_theta, kernels, **kw)
        self.post_attention_layernorm = _rms_norm(d_model, rms_eps, **kw)
        self.mlp = MLP(d_model, d_ff, **kw)

    def __call__(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nnx.Module):
    def __init__(self, *, vocab, seq_len, n_layer, n_head, n_kv_head, d_model, d_ff, param_dtype, dtype,
                 rngs: nnx.Rngs, qkv_bias=False, tie_embeddings=False, rope_theta=ROPE_THETA, rms_eps=RMS_EPS,
                 padding_idx=None, kernels="mirrored"):
        if n_head % n_kv_head or d_model % n_head or (d_model // n_head) % 2:
            raise ValueError(f"Llama needs n_kv_head | n_head | d_model and an even head dimension; got n_head "
                             f"{n_head}, n_kv_head {n_kv_head}, d_model {d_model}")
        padding_idx = check_padding_idx(padding_idx, vocab)
        kw = dict(param_dtype=param_dtype, dtype=dtype, rngs=rngs)
        self.seq_len = seq_len  # the longest context it is trained on (rotary needs no table of it)
        self.embed_tokens = Embed(vocab, d_model, padding_idx=padding_idx, **kw)
        self.layers = nnx.List([DecoderLayer(d_model, n_head, n_kv_head, d_ff, qkv_bias=qkv_bias, rope_theta=rope_theta,
                                             rms_eps=rms_eps, kernels=kernels, **kw) for _ in range(n_layer)])
        self.norm = _rms_norm(d_model, rms_eps, **kw)
        self.lm_head = None if tie_embeddings else _linear(d_model, vocab, **kw)

    def unit_specs(self) -> list[units.UnitSpec]:
        last = units.UnitSpec("head", (("norm",), ("lm_head",)), head) if self.lm_head is not None else \
            units.UnitSpec("head", (("norm",), ("embed_tokens",)), tied_head)
        return [units.UnitSpec("embed", (("embed_tokens",),), embed),
                *(units.UnitSpec(f"layers/{i}", (("layers", i),), layer) for i in range(len(self.layers))), last]

    def __call__(self, tokens):
        return units.run(self, tokens)


def embed(embed_tokens, tokens):
    return embed_tokens(tokens)


def layer(module, x):
    return module(x)


def head(norm, lm_head, x):
    return lm_head(norm(x))


def tied_head(norm, embed_tokens, x):
    """The head is the token embedding, transposed: logits = norm(x) @ embed_tokens.T."""
    return embed_tokens.attend(norm(x))


def check_padding_idx(padding_idx, vocab: int):
    """torch's rule: a row of the vocabulary, negative counted from the end; None for none."""
    if padding_idx is None:
        return None
    if isinstance(padding_idx, bool) or not isinstance(padding_idx, int) or not -vocab <= padding_idx < vocab:
        raise ValueError(f"Llama padding_idx={padding_idx!r} is not a row of the vocabulary ({vocab}): give an int in "
                         f"[-{vocab}, {vocab}) or None")
    return padding_idx % vocab
