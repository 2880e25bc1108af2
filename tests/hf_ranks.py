"""The rank side of tests/torch_ref/test_hf_models.py: transformers' own models, built from tiny configs (nothing
downloaded), trained through torch_ref's library API (`parallelize`, `train_step`) and recorded with
`torch_ref.trace.Recorder(..., strip_prefix=...)`, with no name map and no units given. Nothing
here asserts: the test module does.

The three models carry the traps of models as libraries write them: GPT-2's fused qkv (transformers'
`Conv1D`, weight [in, out]) whose key bias has a gradient that is zero in exact arithmetic, and its
head tied to the token embedding; Llama's grouped-query attention, rotary positions (a non-persistent
`inv_freq` buffer), RMSNorm and untied head; BERT's tied decoder weight *and* bias (the bias reachable
under two module paths), and token-type and position embedding rows that never receive a gradient.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

VOCAB, SEQ, BATCH, STEPS = 64, 8, 8, 2
LR, WEIGHT_DECAY = 1e-2, 0.01
MODELS = ("gpt2", "llama", "bert")
PREFIX = {"gpt2": "transformer.", "llama": "model.", "bert": "bert."}
# The strategies per world size: zero3 everywhere (FSDP2 with the default units: the shared-parameter
# case), and the others spread over N = 2 and 4.
STRATEGIES = {1: ("zero3",), 2: ("ddp", "zero3"), 4: ("zero2", "zero3")}
# GPT-2 (its tied head) under reduction="canonical" at S = 4: zero3 runs 4, 2 and 1 shards a rank at N = 1, 2, 4
CANONICAL, SHARDS = "zero3:canonical", 4


def hf_model(name: str) -> torch.nn.Module:
    """A tiny transformers model in float64, eager attention, no dropout, the same weights every call."""
    from tests.mutations import hf_honest

    assert (hf_honest.VOCAB, hf_honest.SEQ) == (VOCAB, SEQ)
    return hf_honest.hf_model(name, "float64")


def batch(k: int):
    """Step k's global batch: tokens and the tokens shifted by one (BERT, too, learns to predict them)."""
    tokens = np.random.default_rng(k).integers(0, VOCAB, size=(BATCH, SEQ + 1))
    return tokens[:, :-1], tokens[:, 1:]


def loss_fn(out, y):
    """transformers returns an output object; its logits are [batch, seq, vocab]."""
    return F.cross_entropy(out.logits.flatten(0, 1), y.flatten())


def meta(name: str, strategy: str, n: int) -> dict:
    return {"model": f"hf-{name}", "dtype": "float64", "strategy": strategy, "devices": n, "steps": STEPS,
            "optimizer": "adamw", "lr": LR, "weight_decay": WEIGHT_DECAY, "clip_norm": 0.0}


def record(name: str, strategy: str, rank: int, n: int) -> dict:
    """One run ("STRATEGY:canonical": with reduction="canonical", S = SHARDS); rank 0's trace arrays (the
    others: {})."""
    import torch_ref

    strategy, _, reduction = strategy.partition(":")
    extra = {"reduction": "canonical", "shards": SHARDS} if reduction else {}
    model, optimizer = torch_ref.parallelize(
        hf_model(name), strategy=strategy,
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=LR, weight_decay=WEIGHT_DECAY), **extra)
    rows = slice(rank * BATCH // n, (rank + 1) * BATCH // n)
    with torch_ref.trace.Recorder(None, meta(name, strategy, n), model, strip_prefix=PREFIX[name]) as rec:
        rec.init()
        for k in range(1, STEPS + 1):
            x, y = batch(k)
            loss = torch_ref.train_step(model, optimizer, torch.from_numpy(x[rows]), torch.from_numpy(y[rows]),
                                        loss_fn)
            rec.step(k, loss, x, y)
    return rec.arrays


def run_cases(rank: int, n: int) -> dict:
    """Every model under every strategy of world size n, and GPT-2 under canonical zero3: {(model, strategy):
    arrays}."""
    out = {(name, s): record(name, s, rank, n) for name in MODELS for s in STRATEGIES[n]}
    return out | {("gpt2", CANONICAL): record("gpt2", CANONICAL, rank, n)}
