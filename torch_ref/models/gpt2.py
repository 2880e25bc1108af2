"""The torch twin of `jaxdp/models/gpt2.py`: GPT-2 with the standard names and a tied head.

`wte`, `wpe`, `h.<i>.ln_1`, `h.<i>.attn.c_attn`, `h.<i>.attn.c_proj`, `h.<i>.ln_2`, `h.<i>.mlp.c_fc`,
`h.<i>.mlp.c_proj`, `ln_f`: `torch_ref.convert` maps them to the Flax names by module path (nn.Linear
weights transposed to kernels). The head has no weight of its own: logits = F.linear(h, wte.weight),
so `parameters()` holds the tied weight once, and autograd sums both uses into `wte.weight.grad`.
(HF's checkpoints store Conv1D weights [in, out], already the Flax layout; these are nn.Linear.)

Parameters are loaded from the JAX side (`models.load_flax`); torch's own init is never used.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import attention

LN_EPS = 1e-5


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_head, kernels="mirrored"):
        super().__init__()
        self.n_head, self.kernels = n_head, attention.checked(kernels)
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, t, d = x.shape
        h = self.n_head
        q, k, v = (a.reshape(b, t, h, d // h) for a in self.c_attn(x).split(d, dim=-1))
        if self.kernels == "fused":
            return self.c_proj(attention.fused(q, k, v).reshape(b, t, d))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d // h)
        scores = scores.float() if scores.dtype == torch.bfloat16 else scores  # softmax in fp32, as JAX
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1).to(v.dtype)
        return self.c_proj(torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.c_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d_model, n_head, kernels="mirrored"):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model, eps=LN_EPS)
        self.attn = CausalSelfAttention(d_model, n_head, kernels)
        self.ln_2 = nn.LayerNorm(d_model, eps=LN_EPS)
        self.mlp = MLP(d_model)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """GPT-2 (jaxdp/models/gpt2.py): embeddings, pre-LN blocks, final LN, the head tied to `wte`."""

    def __init__(self, *, vocab, seq_len, n_layer, n_head, d_model, kernels="mirrored"):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.h = nn.ModuleList([Block(d_model, n_head, kernels) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d_model, eps=LN_EPS)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # the tied head


def fsdp_units(model: GPT2) -> list[list]:
    """FSDP2 groups for GPT-2: `wpe`, each block, `ln_f`. The tied `wte` is in no unit: the root
    owns it, gathers it once before the first unit's forward, keeps it through the step (FSDP2 never
    reshards the root after forward) and reduce-scatters its summed gradient once after backward."""
    return [[model.wpe], *([b] for b in model.h), [model.ln_f]]
