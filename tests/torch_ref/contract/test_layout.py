"""What torch_ref.check reads off the model and optimizer without running a step (quick): where the parameters
and the optimizer state live, and how a process group's ranks are named."""
from __future__ import annotations

import pytest
import torch

from torch_ref.contract import check, read

pytestmark = pytest.mark.quick


def test_a_plain_optimizer_over_the_whole_model_holds_replicated_state():
    model = torch.nn.Linear(4, 2)
    assert check.layout(model, torch.optim.AdamW(model.parameters())) == (False, False, {})
    assert check.layout(model, None) == (False, None, {})


def test_an_optimizer_over_a_part_holds_a_shard():
    """zero2's flat shard, ZeroRedundancyOptimizer's partition: fewer elements than the model's."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    assert check.layout(model, torch.optim.SGD(model[1].parameters(), lr=0.1))[1] is True


def test_a_group_is_named_by_its_mesh_dimension():
    assert read.axis_name([0, 1, 2, 3], 4, {}) == "world"
    assert read.axis_name([0, 2], 4, {(0, 2): "replicate"}) == "replicate"
    assert read.axis_name([1, 3], 4, {}) == "ranks 1,3"


def test_only_a_gradient_reduction_has_an_overlap_to_read():
    call = {"op": "all-reduce", "task": 7, "at": 3}
    assert read._overlaps(call, {7: 5}) is True  # backward computed after it was issued
    assert read._overlaps(call, {7: 3}) is False  # issued with the last gradient
    assert read._overlaps({**call, "task": -1}, {}) is False  # issued after backward
    assert read._overlaps({**call, "op": "all-gather"}, {7: 5}) is None
