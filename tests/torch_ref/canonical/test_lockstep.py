"""torch_ref/canonical/lockstep.py: this rank's shards' forwards in lockstep (canonical BatchNorm's one
forward per shard). In this process: the shards run one at a time in shard order, each round's statistic
reaches every shard, an error in a shard is raised in the caller, and a shard that asks for more or fewer
statistics than the model has BatchNorm layers is a one-line `CanonicalError`; no thread is left behind."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_ref
from torch_ref import canonical as C
from torch_ref.batchnorm import BatchNorm1d
from torch_ref.canonical import lockstep


def test_shards_run_one_at_a_time_in_order_and_get_each_statistic():
    log, before = [], threading.active_count()

    def shard(i, wait):
        a = wait(i)
        log.append((i, a))
        b = wait(10 * i + a)
        log.append((i, b))
        return a, b

    out = lockstep.run([lambda w, i=i: shard(i, w) for i in range(3)], 2, lambda r, reports: sum(reports) + r)
    assert out == [(3, 40)] * 3  # 0 + 1 + 2 (+ round 0), then 3 + 13 + 23 (+ round 1)
    assert log == [(0, 3), (1, 3), (2, 3), (0, 40), (1, 40), (2, 40)]
    assert threading.active_count() == before


def test_an_error_in_a_shard_is_raised_and_every_thread_ends():
    before = threading.active_count()

    def bad(wait):
        wait(0)
        raise ValueError("shard failed")

    with pytest.raises(ValueError, match="shard failed"):
        lockstep.run([lambda w: (w(1), w(2)), bad], 2, lambda r, reports: 0)
    assert threading.active_count() == before


@pytest.mark.parametrize("asks", [1, 3])
def test_more_or_fewer_statistics_than_rounds_is_one_line(asks):
    before = threading.active_count()

    def shard(wait):
        for k in range(asks):
            wait(k)

    with pytest.raises(C.CanonicalError, match="called once per forward, in registration order"):
        lockstep.run([shard, shard], 2, lambda r, reports: 0)
    assert threading.active_count() == before


class Twice(nn.Module):
    """A BatchNorm called twice per forward: canonical refuses it."""

    def __init__(self):
        super().__init__()
        self.lin, self.bn = nn.Linear(3, 3), BatchNorm1d(3)

    def forward(self, x):
        return self.bn(self.lin(self.bn(x)))


def test_a_model_calling_a_batchnorm_twice_is_refused_in_one_line():
    model, opt = torch_ref.parallelize(Twice(), strategy="single", optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                                       reduction="canonical", shards=2)
    with pytest.raises(C.CanonicalError, match="called once per forward"):
        torch_ref.train_step(model, opt, torch.randn(8, 3), torch.randint(0, 3, (8,)), F.cross_entropy)
