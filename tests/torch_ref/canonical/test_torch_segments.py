"""Canonical BatchNorm by segments (torch_ref/canonical/batchnorm.py) on models as users write them: a
plain stack and one with a skip connection around its BatchNorms. In float64, the sum of the shards'
gradients is BatchNorm's gradient over the whole batch; a segment runs from an empty batch only where the
layers before it matter through its first layer's input alone (`prefix_free`), and forcing it where they
do not is caught."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torch_ref.batchnorm import BatchNorm2d
from torch_ref.canonical import batchnorm as canonical_bn
from torch_ref.tensors import flatten

SHARDS, ROWS = 4, 8


class Stack(nn.Module):
    def __init__(self, skip: bool):
        super().__init__()
        self.skip = skip
        self.conv1, self.bn1 = nn.Conv2d(2, 4, 3, padding=1), BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1), BatchNorm2d(4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        h = self.conv1(x)
        out = self.bn2(self.conv2(F.relu(self.bn1(h))))
        out = F.relu(out + h if self.skip else out)  # a ResNet block's skip: around both BatchNorms
        return self.head(out.mean(dim=(2, 3)))


def _grads(skip: bool, free=None):
    """(canonical gradient: the shards' sum / S, native full-batch gradient, the segments' `free`)."""
    torch.manual_seed(0)
    model = Stack(skip).double()
    x, y = torch.randn(SHARDS * ROWS, 2, 5, 5, dtype=torch.float64), torch.randint(0, 3, (SHARDS * ROWS,))
    params = list(model.parameters())
    native = flatten(torch.autograd.grad(F.cross_entropy(model(x), y), params))
    layers = [model.bn1, model.bn2]
    bns = canonical_bn.BatchNorms(layers, layers, shards=SHARDS)
    if free is not None:
        bns.free = dict(free)
    got = [g for _, g, _ in bns.shard_grads(model, params, x, y, F.cross_entropy, 1, SHARDS)]
    return sum(got) / SHARDS, native, bns.free


@pytest.mark.parametrize("skip", [False, True])
def test_segments_give_batchnorms_gradient(skip):
    canonical, native, free = _grads(skip)
    assert torch.isfinite(canonical).all()
    assert ((canonical - native).abs().max() / native.abs().max()).item() <= 1e-12
    # the plain stack's segments run from an empty batch; the skip's last cannot (its input is conv1's output)
    assert free == ({1: True, 2: True} if not skip else {1: True, 2: False})


def test_a_segment_forced_free_past_a_skip_is_caught():
    with pytest.raises(RuntimeError):  # conv1's output on no rows meets conv2's on ROWS: a shape error
        _grads(True, free={1: True, 2: True})
