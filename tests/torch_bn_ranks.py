"""The rank side of tests/torch_ref/test_torch_batchnorm.py (run in the shared torch world of 2 ranks,
tests/torch_helpers.py): a user's conv net with plain nn.BatchNorm2d and nn.BatchNorm1d, trained through the
library API under every torch strategy after `torch_ref.batchnorm.convert_sync_batchnorm`, plain under ddp and
zero3, and once with a parameter perturbed on one rank only. Nothing here asserts: the test module does."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import torch_ref
from jaxdp.core.registry import strategies as registry
from jaxdp.core.run.config import JIT_STRATEGIES
from jaxdp.core.run.data import part_rows
from torch_ref.batchnorm import convert_sync_batchnorm
from torch_ref.trace import Recorder

BATCH, CHANNELS, SIDE, HIDDEN, CLASSES, STEPS = 16, 2, 5, 6, 3, 3
META = {"dtype": "float64", "optimizer": "adamw", "lr": 0.02, "weight_decay": 0.1, "steps": STEPS}
# every torch strategy converted (accumulation 1 and 2 alternating), plain under ddp and zero3, and a perturbed run:
# (strategy, accum, converted, perturbed)
# (not `single`: in a world of N ranks each rank's sync BatchNorm would count the same rows N times)
CASES = [(s, 1 + i % 2, True, False) for i, s in enumerate(registry.names("torch", oracle="single"))
         if s not in ("single", *JIT_STRATEGIES)]
CASES += [("ddp", 2, False, False), ("zero3", 1, False, False), ("ddp", 1, True, True)]


class ConvNet(nn.Module):
    """conv 3x3 -> BatchNorm2d -> ReLU -> mean over H, W -> Linear -> BatchNorm1d (cumulative average) -> ReLU
    -> Linear: a model the project never saw, written as users write them."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(CHANNELS, 4, 3, padding=1, bias=False)  # a bias before BatchNorm has a zero gradient,
        # whose roundoff Adam turns into lr-sized steps (docs/PARITY.md): users drop it
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, HIDDEN, bias=False)
        self.norm = nn.BatchNorm1d(HIDDEN, momentum=None)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x))).mean(dim=(2, 3))
        return self.head(F.relu(self.norm(self.fc(h))))


def fresh_net(convert: bool = False) -> nn.Module:
    torch.manual_seed(11)
    net = ConvNet().double()
    with torch.no_grad():  # BatchNorm starts at (1, 0): move it, so a wrong scale/bias gradient shows
        net.bn.weight.add_(torch.linspace(-0.3, 0.3, 4, dtype=torch.float64))
        net.norm.bias.add_(0.1)
    return convert_sync_batchnorm(net) if convert else net


def batch(k: int):
    rng = np.random.default_rng(100 + k)
    return rng.standard_normal((BATCH, CHANNELS, SIDE, SIDE)) * 2 + 0.5, rng.integers(0, CLASSES, BATCH)


def optimizer(params):
    return torch.optim.AdamW(params, lr=META["lr"], weight_decay=META["weight_decay"])


def train(rank: int, n: int, strategy: str, accum: int, convert: bool, perturb: bool = False) -> dict:
    """One case through parallelize / train_step / Recorder; the Recorder's meta and arrays (rank 0's).
    `perturb`: rank 1 runs `perturbed` after each step (bugs the spread must catch)."""
    model, opt = torch_ref.parallelize(fresh_net(convert), strategy=strategy, optimizer=optimizer, accum=accum)
    world = 1 if strategy == "single" else n
    with Recorder(None, {**META, "strategy": strategy, "devices": n, "accum": accum}, model) as rec:
        rec.init()
        for k in range(1, STEPS + 1):
            x, y = batch(k)
            xs, ys = (torch.from_numpy(part_rows(a, 0 if world == 1 else rank, world, accum)) for a in (x, y))
            loss = torch_ref.train_step(model, opt, xs, ys, F.cross_entropy)
            if perturb and rank == 1:
                perturbed(torch_ref.api.state_of(model).module, k)
            rec.step(k, loss, x, y)
    return {"meta": rec.meta, "arrays": rec.arrays}


def perturbed(net: ConvNet, k: int) -> None:
    """Rank 1's bugs: after step 2 a parameter moved by 1e-3, after step 3 a running variance made NaN (invisible
    in rank 0's trace but for the spread)."""
    with torch.no_grad():
        if k == 2:
            net.head.bias[0] += 1e-3
        if k == 3:
            net.norm.running_var[0] = float("nan")


def run_cases(rank: int, n: int) -> dict:
    return {case: train(rank, n, *case) for case in CASES}
