"""The torch twin of `jaxdp/models/llama.py`: Llama with transformers' module names, less `model.`.

`embed_tokens`, `layers.<i>.input_layernorm`, `layers.<i>.self_attn.{q,k,v,o}_proj`,
`layers.<i>.post_attention_layernorm`, `layers.<i>.mlp.{gate,up,down}_proj`, `norm`, `lm_head`:
`torch_ref.convert` maps them to the Flax names by module path (nn.Linear weights transposed to
kernels, RMSNorm weights to `scale`). No biases and an untied head by default; the options are the JAX
side's, same names: `qkv_bias`, `tie_embeddings` (the head is `embed_tokens.weight`: no `lm_head`),
`rope_theta`, `rms_eps`, `padding_idx` (nn.Embedding's own). `config_kwargs(config)`: a transformers
Llama / Qwen2 / Mistral config as the keyword arguments of both Llamas, or one line naming what they lack.

Rotary cos and sin are computed as the JAX side computes them: in float64 for a float64 model, else
in fp32 (then cast to the compute dtype), so the frameworks agree to roundoff in float64. RMSNorm
is nn.RMSNorm's parameters with jaxdp's order of operations (x * (rsqrt(mean x^2 + eps) * scale)),
its statistics in fp32 under bf16.

Parameters are loaded from the JAX side (`models.load_flax`); torch's own init is never used.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import attention

RMS_EPS = 1e-6
ROPE_THETA = 10000.0


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm (weight -> Flax `scale`) computed as flax's nnx.RMSNorm: statistics in at least fp32."""

    def forward(self, x):
        stats = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
        mul = torch.rsqrt(stats.square().mean(-1, keepdim=True) + self.eps) * self.weight.to(stats.dtype)
        return (stats * mul).to(x.dtype)


def rotary(seq_len: int, head_dim: int, dtype: torch.dtype, device=None, theta: float = ROPE_THETA):
    """cos, sin [seq_len, head_dim] (jaxdp/models/llama.py's `rotary`): float64 angles for float64, else fp32."""
    angle_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=angle_dtype, device=device) / head_dim))
    angles = torch.arange(seq_len, dtype=angle_dtype, device=device)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x, cos, sin):
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, d_model, n_head, n_kv_head, qkv_bias, rope_theta, kernels="mirrored"):
        super().__init__()
        self.n_head, self.n_kv_head, self.rope_theta = n_head, n_kv_head, rope_theta
        self.kernels = attention.checked(kernels)
        head_dim = d_model // n_head
        self.q_proj = nn.Linear(d_model, n_head * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(d_model, n_kv_head * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(d_model, n_kv_head * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(n_head * head_dim, d_model, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        h, g = self.n_head, self.n_kv_head
        hd, rep = d // h, h // g
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # bf16 under autocast
        cos, sin = rotary(t, hd, q.dtype, x.device, self.rope_theta)
        q = apply_rotary(q.reshape(b, t, h, hd), cos, sin)
        k = apply_rotary(k.reshape(b, t, g, hd), cos, sin)
        v = v.reshape(b, t, g, hd)
        if self.kernels == "fused":  # query head j reads kv head j // rep (SDPA's enable_gqa)
            return self.o_proj(attention.fused(q, k, v).reshape(b, t, d))
        q = q.reshape(b, t, g, rep, hd)  # query head j = kv group j // rep (transformers' repeat_kv)
        scores = torch.einsum("bqgrd,bkgd->bgrqk", q, k) * hd ** -0.5
        scores = scores.float() if scores.dtype == torch.bfloat16 else scores  # softmax in fp32, as JAX
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1).to(v.dtype)
        return self.o_proj(torch.einsum("bgrqk,bkgd->bqgrd", weights, v).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, d_model, n_head, n_kv_head, d_ff, *, qkv_bias, rope_theta, rms_eps, kernels="mirrored"):
        super().__init__()
        self.input_layernorm = RMSNorm(d_model, eps=rms_eps)
        self.self_attn = Attention(d_model, n_head, n_kv_head, qkv_bias, rope_theta, kernels)
        self.post_attention_layernorm = RMSNorm(d_model, eps=rms_eps)
        self.mlp = MLP(d_model, d_ff)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """Llama (jaxdp/models/llama.py): embedding, pre-RMSNorm decoder layers, final RMSNorm, head."""

    def __init__(self, *, vocab, seq_len, n_layer, n_head, n_kv_head, d_model, d_ff, qkv_bias=False,
                 tie_embeddings=False, rope_theta=ROPE_THETA, rms_eps=RMS_EPS, padding_idx=None, kernels="mirrored"):
        super().__init__()
        self.seq_len = seq_len
        self.embed_tokens = nn.Embedding(vocab, d_model, padding_idx=padding_idx)
        self.layers = nn.ModuleList([DecoderLayer(d_model, n_head, n_kv_head, d_ff, qkv_bias=qkv_bias,
                                                  rope_theta=rope_theta, rms_eps=rms_eps, kernels=kernels)
                                     for _ in range(n_layer)])
        self.norm = RMSNorm(d_model, eps=rms_eps)
        self.lm_head = None if tie_embeddings else nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        if self.lm_head is None:  # tied: the head is the embedding's weight (root-owned under FSDP2)
            return F.linear(self.norm(x), self.embed_tokens.weight)
        return self.lm_head(self.norm(x))


def fsdp_units(model: Llama) -> list[list]:
    """FSDP2 groups for Llama, the JAX side's units: `embed_tokens`, each decoder layer, `norm` with `lm_head`.
    Tied: `embed_tokens` in no unit (the root owns it, as gpt2's `wte`), `norm` alone."""
    if model.lm_head is None:
        return [*([layer] for layer in model.layers), [model.norm]]
    return [[model.embed_tokens], *([layer] for layer in model.layers), [model.norm, model.lm_head]]


FAMILIES = ("llama", "qwen2", "mistral")  # transformers' model_type values that these Llamas express


def _inexpressible(config) -> list[str]:
    """What a transformers config asks for that the Llama options cannot express, one phrase each."""
    found = []
    if config.model_type not in FAMILIES:
        found.append(f"model_type {config.model_type!r} (these Llamas express {', '.join(FAMILIES)})")
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        found.append(f"rope_type {rope['rope_type']!r} (only the default rotary)")
    head_dim = getattr(config, "head_dim", None)
    if head_dim not in (None, config.hidden_size // config.num_attention_heads):
        found.append(f"head_dim {head_dim} (here hidden_size / num_attention_heads)")
    if getattr(config, "attention_bias", False):
        found.append("attention_bias=True (o_proj's bias too; qkv_bias= covers q/k/v only)")
    if getattr(config, "mlp_bias", False):
        found.append("mlp_bias=True")
    if config.hidden_act != "silu":
        found.append(f"hidden_act {config.hidden_act!r} (SwiGLU with silu only)")
    if getattr(config, "attention_dropout", 0.0):
        found.append(f"attention_dropout {config.attention_dropout} (no dropout)")
    window = getattr(config, "sliding_window", None)
    if config.model_type == "qwen2" and not getattr(config, "use_sliding_window", False):
        window = None
    if window is not None and window < config.max_position_embeddings:
        found.append(f"sliding_window {window} < max_position_embeddings {config.max_position_embeddings}")
    return found


def config_kwargs(config) -> dict:
    """A transformers `LlamaConfig`, `Qwen2Config` or `MistralConfig` as the keyword arguments of both
    Llamas (`jaxdp.models.Llama` adds param_dtype, dtype, rngs): every option the config gives (Qwen2's
    q/k/v biases, `tie_word_embeddings`, the rotary theta, the RMSNorm eps, `pad_token_id` as
    padding_idx). Anything they cannot express is one ValueError line naming it."""
    found = _inexpressible(config)
    if found:
        raise ValueError(f"{type(config).__name__} asks for what jaxdp's Llama cannot express: {'; '.join(found)}: "
                         f"write the model as your own NNX module (docs/LIBRARY.md)")
    rope = getattr(config, "rope_parameters", None) or {"rope_theta": getattr(config, "rope_theta", ROPE_THETA)}
    return dict(vocab=config.vocab_size, seq_len=config.max_position_embeddings, n_layer=config.num_hidden_layers,
                n_head=config.num_attention_heads, n_kv_head=config.num_key_value_heads or config.num_attention_heads,
                d_model=config.hidden_size, d_ff=config.intermediate_size, qkv_bias=config.model_type == "qwen2",
                tie_embeddings=bool(config.tie_word_embeddings), rope_theta=float(rope["rope_theta"]),
                rms_eps=float(config.rms_norm_eps), padding_idx=config.pad_token_id)
