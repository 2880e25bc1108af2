"""The torch twin of jaxdp/models/gpt.py: a decoder-only transformer, written out as jaxdp's."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import attention

LN_EPS = 1e-5  # as jaxdp/models/gpt.py and torch.nn.LayerNorm


class Attention(nn.Module):
    """Causal self-attention written out as jaxdp's: qkv (no bias) split q | k | v, heads contiguous
    (`kernels="fused"`: `attention.fused`)."""

    def __init__(self, d_model, n_head, kernels="mirrored"):
        super().__init__()
        self.n_head, self.kernels = n_head, attention.checked(kernels)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, t, d = x.shape
        h = self.n_head
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (a.reshape(b, t, h, d // h) for a in (q, k, v))
        if self.kernels == "fused":
            return self.proj(attention.fused(q, k, v).reshape(b, t, d))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d // h)
        if scores.dtype == torch.bfloat16:  # softmax in fp32, as the JAX side
            scores = scores.float()
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        weights = torch.softmax(scores, dim=-1).to(v.dtype)
        out = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
        return self.proj(out)


class MLPBlock(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))  # exact (erf) GELU


class Block(nn.Module):
    def __init__(self, d_model, n_head, kernels="mirrored"):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model, eps=LN_EPS)
        self.attn = Attention(d_model, n_head, kernels)
        self.ln2 = nn.LayerNorm(d_model, eps=LN_EPS)
        self.mlp = MLPBlock(d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only transformer, as jaxdp/models/gpt.py: embeddings, pre-norm blocks, final LN, head."""

    def __init__(self, *, vocab, seq_len, n_layer, n_head, d_model, kernels="mirrored"):
        super().__init__()
        self.tok_embed = nn.Embedding(vocab, d_model)
        self.pos_embed = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList([Block(d_model, n_head, kernels) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d_model, eps=LN_EPS)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_embed(tokens) + self.pos_embed(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
