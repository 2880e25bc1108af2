"""The rank side of tests/torch_ref/models/test_torch_shared.py (run in the shared torch world of 2 ranks, from
tests/torch_api_ranks.py): models whose parameters are shared, trained by zero3 with its default units
and by single, each recorded. Nothing here asserts: the test module does."""
from __future__ import annotations

import importlib.util

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import torch_ref
from torch_ref.trace import Recorder

STEPS, ROWS, SEQ, VOCAB, FEATURES, HIDDEN = 3, 4, 8, 96, 5, 6


def hf_gpt2():
    """Hugging Face's GPT-2 as a user has it (its head tied to `wte`), tiny, float64, no dropout."""
    import transformers

    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=SEQ, vocab_size=VOCAB,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                     eos_token_id=0, attn_implementation="eager")
    torch.manual_seed(1)
    return transformers.GPT2LMHeadModel(config).double()


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(HIDDEN, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)

    def forward(self, x):
        return x + torch.tanh(self.norm(self.fc(x)))


class SharedBlocks(nn.Module):
    """Two blocks whose `fc` share one weight (their biases are their own)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(FEATURES, HIDDEN)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.blocks[1].fc.weight = self.blocks[0].fc.weight
        self.out = nn.Linear(HIDDEN, 3)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


def shared_blocks() -> SharedBlocks:
    torch.manual_seed(2)
    return SharedBlocks().double()


def lm_loss(out, y):
    return F.cross_entropy(out.logits.reshape(-1, VOCAB), y.reshape(-1))


# name: (model factory, loss, batch k -> (x, y), Recorder's strip_prefix)
MODELS = {
    "shared-blocks": (shared_blocks, F.cross_entropy,
                      lambda k: (np.random.default_rng(k).standard_normal((ROWS, FEATURES)),
                                 np.random.default_rng(k + 9).integers(0, 3, ROWS)), ""),
    "hf-gpt2": (hf_gpt2, lm_loss,
                lambda k: tuple(np.random.default_rng(k).integers(0, VOCAB, (2, ROWS, SEQ))), "transformer."),
}


def train(rank: int, n: int, name: str, strategy: str) -> dict:
    """`name`'s model through the library API under `strategy`, 2 micro-batches a step, clipped: the
    Recorder's arrays (rank 0's) and the default units' names."""
    make, loss_fn, batch, strip = MODELS[name]
    net = make()
    model, opt = torch_ref.parallelize(net, strategy=strategy, accum=2,
                                       optimizer=lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1))
    rows = slice(None) if strategy == "single" else slice(rank * ROWS // n, (rank + 1) * ROWS // n)
    with Recorder(None, {}, model, strip_prefix=strip) as rec:
        rec.init()
        for k in range(1, STEPS + 1):
            x, y = batch(k)
            loss = torch_ref.train_step(model, opt, torch.from_numpy(x[rows]), torch.from_numpy(y[rows]),
                                        loss_fn, clip_norm=0.5)
            rec.step(k, loss, x, y)
    return rec.arrays


def run(rank: int, n: int) -> dict:
    """Each model under zero3 and under single, the reference (every rank runs both: single's first step
    checks the rows of every rank, a collective)."""
    names = [m for m in MODELS if m != "hf-gpt2" or importlib.util.find_spec("transformers")]
    return {name: {strategy: train(rank, n, name, strategy) for strategy in ("zero3", "single")} for name in names}
