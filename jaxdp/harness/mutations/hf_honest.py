"""The transformers side of the honest matrix (`jaxdp.harness.mutations.honest`): models built from tiny configs
(nothing downloaded), trained through `torch_ref.parallelize` and recorded with `torch_ref.trace.Recorder`,
as a user porting a model would. Five families, each with a trap of models as libraries write them:

  gpt2    fused qkv (Conv1D) with a roundoff-only key bias, head tied to the token embedding
  llama   grouped-query attention, rotary positions, RMSNorm, untied head
  bert    tied decoder weight and bias, embedding rows that never get a gradient
  neox    GPT-NeoX: fused qkv (Linear), partial rotary (a quarter of each head), parallel residual
  resnet  ResNet with BatchNorm (synchronised: `torch_ref.batchnorm.convert_sync_batchnorm`), 16 x 16
          random images, a classification loss

`run_world(rank, n, cases)` runs every case of one world size and returns rank 0's traces, with
transformers' float32 sites promoted to the model's dtype (`promoted_sites`, as tests/jaxdp/models/test_llama.py does):
Llama's RMSNorm, the eager softmax and the rotary angles run in float32 whatever the model's dtype, so a
float64 transformers model is not a float64 model (docs/LIBRARY.md), and the float64 bounds would judge it
against float32 roundoff.
"""
from __future__ import annotations

import numpy as np

VOCAB, SEQ, BATCH, IMAGE, CLASSES = 64, 8, 12, 16, 10
PREFIX = {"gpt2": "transformer.", "llama": "model.", "bert": "bert.", "neox": "gpt_neox.", "resnet": "resnet."}
LR = {"adamw": 1e-2, "adam": 1e-2, "momentum": 0.05, "sgd": 0.05}


def hf_model(name: str, dtype: str):
    """A tiny transformers model, eager attention, no dropout, the same weights every call."""
    import torch
    import transformers as hf

    from torch_ref import batchnorm

    torch.manual_seed(0)
    small = dict(vocab_size=VOCAB, attn_implementation="eager")
    if name == "gpt2":
        model = hf.GPT2LMHeadModel(hf.GPT2Config(n_positions=SEQ, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
                                                 embd_pdrop=0.0, attn_pdrop=0.0, **small))
    elif name == "llama":
        model = hf.LlamaForCausalLM(hf.LlamaConfig(max_position_embeddings=SEQ, hidden_size=16, num_hidden_layers=2,
                                                   num_attention_heads=4, num_key_value_heads=2,
                                                   intermediate_size=32, **small))
    elif name == "bert":
        model = hf.BertForMaskedLM(hf.BertConfig(max_position_embeddings=2 * SEQ, hidden_size=16, num_hidden_layers=2,
                                                 num_attention_heads=2, intermediate_size=32, hidden_dropout_prob=0.0,
                                                 attention_probs_dropout_prob=0.0, **small))
    elif name == "neox":
        model = hf.GPTNeoXForCausalLM(hf.GPTNeoXConfig(
            max_position_embeddings=SEQ, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, rotary_pct=0.25, hidden_dropout=0.0, attention_dropout=0.0, **small))
    else:
        model = hf.ResNetForImageClassification(hf.ResNetConfig(
            num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
            num_labels=CLASSES))
        model = batchnorm.convert_sync_batchnorm(model)
    return model.to(torch.float64 if dtype == "float64" else torch.float32)


def batch(name: str, k: int, dtype: str):
    """Step k's global batch (x, y): tokens and the next tokens, or images and labels."""
    rng = np.random.default_rng(k)
    if name == "resnet":
        x = rng.standard_normal((BATCH, 3, IMAGE, IMAGE)).astype(np.float64 if dtype == "float64" else np.float32)
        return x, rng.integers(0, CLASSES, size=BATCH)
    tokens = rng.integers(0, VOCAB, size=(BATCH, SEQ + 1))
    return tokens[:, :-1], tokens[:, 1:]


def loss_fn(out, y):
    import torch.nn.functional as F

    logits = out.logits
    return F.cross_entropy(logits.flatten(0, 1) if logits.dim() == 3 else logits, y.flatten())


def optimizer(name: str, params):
    """torch's optimizers with torch's defaults (AdamW: weight decay 0.01)."""
    import torch

    if name == "adamw":
        return torch.optim.AdamW(params, lr=LR[name])
    if name == "adam":
        return torch.optim.Adam(params, lr=LR[name])
    return torch.optim.SGD(params, lr=LR[name], momentum=0.9 if name == "momentum" else 0.0)


def meta(case: dict) -> dict:
    return {"model": f"hf-{case['model']}", "dtype": case["dtype"], "strategy": case["strategy"],
            "devices": case["devices"], "steps": case["steps"], "clip_norm": 0.0}


def record(case: dict, rank: int, n: int) -> tuple[dict, dict]:
    """One run of `case` (model, strategy, dtype, optimizer, steps): rank 0's (meta, arrays)."""
    import torch

    import torch_ref

    name, dtype = case["model"], case["dtype"]
    options = {"replicas": 2 if n % 2 == 0 else 1} if case["strategy"] == "hsdp" else {}
    model, opt = torch_ref.parallelize(hf_model(name, dtype), strategy=case["strategy"],
                                       optimizer=lambda ps: optimizer(case["optimizer"], ps), **options)
    rows = slice(rank * BATCH // n, (rank + 1) * BATCH // n)
    with torch_ref.trace.Recorder(None, meta(case), model, strip_prefix=PREFIX[name], optimizer=opt) as rec:
        rec.init()
        for k in range(1, case["steps"] + 1):
            x, y = batch(name, k, dtype)
            loss = torch_ref.train_step(model, opt, torch.from_numpy(x[rows]), torch.from_numpy(y[rows]), loss_fn)
            rec.step(k, loss, x, y)
    return rec.meta, rec.arrays


def rms_norm_in_dtype(self, h):
    """transformers' RMSNorm (Llama), normalising in its input's dtype rather than float32."""
    import torch

    return self.weight * (h * torch.rsqrt(h.square().mean(-1, keepdim=True) + self.variance_epsilon))


def rotary_in_float64(self, x, position_ids):
    """transformers' rotary table (base 1e4, default scaling) from float64 angles rather than float32."""
    import torch

    dim = 2 * self.inv_freq.shape[0]
    angles = position_ids[..., None].double() / 1e4 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def promoted_sites() -> None:
    """transformers' float32 sites in the model's dtype: RMSNorm, softmax, rotary angles (Llama, GPT-NeoX)."""
    import torch
    from transformers.models.gpt_neox import modeling_gpt_neox as neox
    from transformers.models.llama import modeling_llama as llama

    softmax = torch.nn.functional.softmax
    llama.LlamaRMSNorm.forward = rms_norm_in_dtype
    llama.LlamaRotaryEmbedding.forward = neox.GPTNeoXRotaryEmbedding.forward = rotary_in_float64
    torch.nn.functional.softmax = lambda x, dim=None, dtype=None, **kw: softmax(x, dim=dim)


def run_world(rank: int, n: int, cases: list, promote: bool = True) -> list:
    """Every case of world size n, in order: rank 0's (meta, arrays) of each (the other ranks: None)."""
    if promote:
        promoted_sites()
    out = []
    for case in cases:
        m, arrays = record(case, rank, n)
        out.append((m, arrays) if rank == 0 else None)
    return out
