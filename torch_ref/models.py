"""The torch mirrors of `jaxdp.models` (`mlp`, `gpt`), and the bridge to the Flax parameters.

`build` also builds the twins that have their own files: gpt2.py, llama.py, cnn.py.

The modules are registered in the Flax models' definition order, so `parameters()` follows
`jaxdp.models.definition_order` (bucketed all-reduce relies on that order). They are initialised
from the JAX side's parameters (`load_flax`), never from torch's own init, so both frameworks start
bit-identical; `to_flax` converts back to trace names and layouts (a Linear weight [out, in] is the
Flax kernel [in, out]).
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import convert
from .gpt2 import GPT2
from .llama import Llama

LN_EPS = 1e-5  # as jaxdp/models/gpt.py and torch.nn.LayerNorm
MASTER_DTYPE = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.float32}
COMPUTE_DTYPE = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def numpy_master_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype of the master parameters (and of the float inputs) for `--dtype`."""
    return np.dtype(str(MASTER_DTYPE[dtype]).removeprefix("torch."))


class MLP(nn.Module):
    """Linear layers with tanh between them and none after the last (jaxdp/models/mlp.py)."""

    def __init__(self, sizes):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=False)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.tanh(x)
        return x


class Attention(nn.Module):
    """Causal self-attention written out as jaxdp's: qkv (no bias) split q | k | v, heads contiguous."""

    def __init__(self, d_model, n_head):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, t, d = x.shape
        h = self.n_head
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (a.reshape(b, t, h, d // h) for a in (q, k, v))
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
    def __init__(self, d_model, n_head):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model, eps=LN_EPS)
        self.attn = Attention(d_model, n_head)
        self.ln2 = nn.LayerNorm(d_model, eps=LN_EPS)
        self.mlp = MLPBlock(d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only transformer, as jaxdp/models/gpt.py: embeddings, pre-norm blocks, final LN, head."""

    def __init__(self, *, vocab, seq_len, n_layer, n_head, d_model):
        super().__init__()
        self.tok_embed = nn.Embedding(vocab, d_model)
        self.pos_embed = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList([Block(d_model, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d_model, eps=LN_EPS)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_embed(tokens) + self.pos_embed(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build(cfg, dataset) -> nn.Module:
    """The torch model of `cfg` in its master dtype (parameters still torch's: call `load_flax`)."""
    if cfg.model == "mlp":
        model = MLP((dataset.n_features, *cfg.hidden, dataset.n_classes))
    elif cfg.model == "gpt":
        model = GPT(vocab=dataset.n_classes, seq_len=cfg.seq_len, n_layer=cfg.n_layer, n_head=cfg.n_head,
                    d_model=cfg.d_model)
    elif cfg.model == "cnn":
        from .cnn import CNN

        model = CNN(cfg.channels, dataset.n_classes, cfg.batchnorm, cfg.conv_bias)
    elif cfg.model == "gpt2":
        model = GPT2(vocab=dataset.n_classes, seq_len=cfg.seq_len, n_layer=cfg.n_layer, n_head=cfg.n_head,
                     d_model=cfg.d_model)
    elif cfg.model == "llama":
        model = Llama(vocab=dataset.n_classes, seq_len=cfg.seq_len, n_layer=cfg.n_layer, n_head=cfg.n_head,
                      n_kv_head=cfg.kv_heads(), d_model=cfg.d_model, d_ff=cfg.ffn_width())
    else:
        raise ValueError(f"unknown model {cfg.model!r}; valid: mlp, gpt, cnn, gpt2, llama")
    return model.to(MASTER_DTYPE[cfg.dtype])


def loss_fn(model, x, y, dtype: str):
    """Mean softmax cross-entropy over every row (and position) of `x`. bfloat16 runs compute under
    CPU/CUDA autocast with fp32 master parameters; the loss is taken in fp32 from bf16 logits."""
    autocast = (torch.autocast(x.device.type, dtype=torch.bfloat16) if dtype == "bfloat16"
                else contextlib.nullcontext())
    with autocast:
        logits = model(x)
    logits = logits.float() if logits.dtype == torch.bfloat16 else logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


# ---- Flax names and layouts (the general mapping lives in torch_ref.convert) ----------------------
def flax_names(model: nn.Module) -> dict[str, tuple[str, tuple[int, ...] | None]]:
    """{torch name: (Flax name, layout)} in `parameters()` order (then mapped buffers), e.g.
    'layers.0.weight' -> ('layers/0/kernel', (1, 0)): layout is the torch -> Flax axis permutation,
    None where the layouts agree (truthy exactly where a transpose is needed)."""
    return {name: tuple(m) for name, m in convert.mapping(model).items()}


def to_flax(tensors: dict[str, torch.Tensor], names: dict[str, tuple]) -> dict[str, np.ndarray]:
    """Torch-named full tensors -> Flax-named NumPy arrays in Flax layout (Linear weights transposed)."""
    return {names[name][0]: convert.flax_array(t, names[name][1]) for name, t in tensors.items()}


def load_flax(model: nn.Module, flat: dict[str, np.ndarray]) -> nn.Module:
    """Copy Flax-named NumPy parameters (from `jaxdp.models.init`) into `model`, bit for bit."""
    return convert.load_flax(model, flat)
