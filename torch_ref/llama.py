"""The torch twin of `jaxdp/models/llama.py`: Llama with transformers' module names, less `model.`.

`embed_tokens`, `layers.<i>.input_layernorm`, `layers.<i>.self_attn.{q,k,v,o}_proj`,
`layers.<i>.post_attention_layernorm`, `layers.<i>.mlp.{gate,up,down}_proj`, `norm`, `lm_head`:
`torch_ref.convert` maps them to the Flax names by module path (nn.Linear weights transposed to
kernels, RMSNorm weights to `scale`). No biases; the head is untied.

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

RMS_EPS = 1e-6
ROPE_THETA = 10000.0


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm (weight -> Flax `scale`) computed as flax's nnx.RMSNorm: statistics in at least fp32."""

    def forward(self, x):
        stats = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
        mul = torch.rsqrt(stats.square().mean(-1, keepdim=True) + self.eps) * self.weight.to(stats.dtype)
        return (stats * mul).to(x.dtype)


def rotary(seq_len: int, head_dim: int, dtype: torch.dtype, device=None):
    """cos, sin [seq_len, head_dim] (jaxdp/models/llama.py's `rotary`): float64 angles for float64, else fp32."""
    angle_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=angle_dtype, device=device) / head_dim))
    angles = torch.arange(seq_len, dtype=angle_dtype, device=device)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x, cos, sin):
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, d_model, n_head, n_kv_head):
        super().__init__()
        self.n_head, self.n_kv_head = n_head, n_kv_head
        head_dim = d_model // n_head
        self.q_proj = nn.Linear(d_model, n_head * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_head * head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_head * head_dim, bias=False)
        self.o_proj = nn.Linear(n_head * head_dim, d_model, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        h, g = self.n_head, self.n_kv_head
        hd, rep = d // h, h // g
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # bf16 under autocast
        cos, sin = rotary(t, hd, q.dtype, x.device)
        q = apply_rotary(q.reshape(b, t, h, hd), cos, sin)
        k = apply_rotary(k.reshape(b, t, g, hd), cos, sin)
        v = v.reshape(b, t, g, hd)
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
    def __init__(self, d_model, n_head, n_kv_head, d_ff):
        super().__init__()
        self.input_layernorm = RMSNorm(d_model, eps=RMS_EPS)
        self.self_attn = Attention(d_model, n_head, n_kv_head)
        self.post_attention_layernorm = RMSNorm(d_model, eps=RMS_EPS)
        self.mlp = MLP(d_model, d_ff)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """Llama (jaxdp/models/llama.py): embedding, pre-RMSNorm decoder layers, final RMSNorm, untied head."""

    def __init__(self, *, vocab, seq_len, n_layer, n_head, n_kv_head, d_model, d_ff):
        super().__init__()
        self.seq_len = seq_len
        self.embed_tokens = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList([DecoderLayer(d_model, n_head, n_kv_head, d_ff) for _ in range(n_layer)])
        self.norm = RMSNorm(d_model, eps=RMS_EPS)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def fsdp_units(model: Llama) -> list[list]:
    """FSDP2 groups for Llama, the JAX side's units: `embed_tokens`, each decoder layer, `norm` with `lm_head`."""
    return [[model.embed_tokens], *([layer] for layer in model.layers), [model.norm, model.lm_head]]
