"""The rank side of tests/torch_ref/test_torch_api.py (run in the shared torch worlds of tests/torch_helpers.py):
a model the project never saw, trained through torch_ref's library API (`parallelize`, `train_step`,
`trace.Recorder`) under every strategy. Nothing here asserts: the test module does."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import torch_ref
from jaxdp.core.registry import strategies as registry
from jaxdp.core.run.config import JIT_STRATEGIES
from torch_ref.trace import Recorder

from . import torch_shared_ranks

BATCH, FEATURES, HIDDEN, CLASSES, STEPS = 18, 5, 7, 3, 3  # 18 rows: N x accum divide it for N <= 3
# hsdp: test_hsdp.py; the -jit names run their twins' code (torch_ref.strategies.TWINS)
DIMENSIONS = {"strategy": [s for s in registry.names("torch", oracle="single") if s not in ("hsdp", *JIT_STRATEGIES)],
              "devices": [1, 2, 3], "accum": [1, 3],
              "optimizer": ["momentum", "adamw"], "clip_norm": [0.0, 0.2]}
# Every strategy with every N (27 cases), the other values alternating so that every pair meets.
CASES = [(s, n, DIMENSIONS["accum"][(i + n) % 2], DIMENSIONS["optimizer"][(n // 2 + i // 2) % 2],
          DIMENSIONS["clip_norm"][(n // 2 + i // 4) % 2])
         for i, s in enumerate(DIMENSIONS["strategy"]) for n in DIMENSIONS["devices"]]
UNITS = ("zero3", 2, 3, "adamw", 0.2, "units")  # zero3 with units= given: the first two layers as one group
OPTIMIZERS = {"momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
              "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.02, weight_decay=0.1)}


class Net(nn.Module):
    """Linear -> LayerNorm -> tanh -> Linear without bias."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(FEATURES, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)
        self.out = nn.Linear(HIDDEN, CLASSES, bias=False)

    def forward(self, x):
        return self.out(torch.tanh(self.norm(self.inp(x))))


def fresh_net() -> Net:
    torch.manual_seed(7)
    net = Net().double()
    with torch.no_grad():  # LayerNorm starts at (1, 0): move it, so a wrong scale/bias gradient shows
        net.norm.weight.add_(torch.linspace(-0.3, 0.3, HIDDEN, dtype=torch.float64))
        net.norm.bias.add_(0.1)
    return net


def batch(k: int):
    rng = np.random.default_rng(k)
    return rng.standard_normal((BATCH, FEATURES)), rng.integers(0, CLASSES, BATCH)


def train_case(rank: int, n: int, case: tuple, path=None) -> dict:
    """`case` through the library API on this rank; the Recorder's arrays (rank 0) and every step's loss."""
    strategy, _, accum, optimizer, clip_norm, *extra = case
    net = fresh_net()
    options = {"units": [[net.inp, net.norm]]} if extra else {}
    model, opt = torch_ref.parallelize(net, strategy=strategy, optimizer=OPTIMIZERS[optimizer], accum=accum,
                                       **options)
    rows = slice(None) if strategy == "single" else slice(rank * BATCH // n, (rank + 1) * BATCH // n)
    losses = []
    with Recorder(path, {"strategy": strategy, "devices": n}, model) as rec:
        rec.init()
        for k in range(1, STEPS + 1):
            x, y = batch(k)
            loss = torch_ref.train_step(model, opt, torch.from_numpy(x[rows]), torch.from_numpy(y[rows]),
                                        F.cross_entropy, clip_norm=clip_norm)
            losses.append(loss)
            rec.step(k, loss, x, y)
    return {"arrays": rec.arrays, "losses": losses}


def run_cases(rank: int, n: int, path: str) -> dict:
    """Every case of world size n; the first one's trace is also written to `path` (by rank 0)."""
    cases = [c for c in CASES + [UNITS] if c[1] == n]
    out = {case: train_case(rank, n, case, path if case == cases[0] else None) for case in cases}
    if n > 1:
        out["unequal_rows"] = unequal_rows(rank)
    if n == 2:  # tests/torch_ref/models/test_torch_shared.py: shared parameters under zero3's default units
        out["shared"] = torch_shared_ranks.run(rank, n)
    return out


def unequal_rows(rank: int) -> str:
    """Rank 0 gets 6 rows, the others 7: every rank must raise the same error (none may hang)."""
    model, opt = torch_ref.parallelize(fresh_net(), strategy="ddp", optimizer=OPTIMIZERS["adamw"])
    x, y = batch(1)
    rows = 6 if rank == 0 else 7
    try:
        torch_ref.train_step(model, opt, torch.from_numpy(x[:rows]), torch.from_numpy(y[:rows]), F.cross_entropy)
    except ValueError as e:
        return str(e)
    return "no error"
