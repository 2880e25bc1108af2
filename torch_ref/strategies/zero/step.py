"""The ZeRO step's update and gather, into which zero2 (`zero2.py`) plugs its gradient sync: the stage's
`grads` (each rank keeps its shard of the mean gradient) -> `update` (the clip by the whole gradient's
norm, the optimizer on this rank's shard) -> `gather` (the updated shards all-gathered into every rank's
full parameters, where the layout gathers after the update: `layout.Layout.gathers_after_update`).
The torch twin of `jaxdp/strategies/zero/step.py`'s `train_step`. zero1 (ZeroRedundancyOptimizer) and
zero3 (FSDP2) run torch's own update and gather.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from ...collectives import all_gather
from ..common import unflatten_into
from . import flat


class FlatShard(NamedTuple):
    """What a rank of zero2 holds: its master shard of the flat padded vector (`main_param`, the one tensor
    its optimizer steps) and the full parameters (by name) that the shards are gathered into."""
    main_param: nn.Parameter
    names: tuple
    params: tuple
    numel: int  # the unpadded length of the flat vector


def full_grads(shard: FlatShard) -> dict:
    """{name: the full mean gradient}, all-gathered from the shards (extra traffic, only when tracing)."""
    full = all_gather(shard.main_param.grad)[:shard.numel]
    return dict(zip(shard.names, flat.unpad(full, shard.params), strict=True))


def clip_(shard: FlatShard, max_norm: float) -> None:
    """Clip the gradient shard by the norm of the *whole* gradient (the all-reduced sum of the shards'
    squares), with torch.nn.utils.clip_grads_with_norm_, the sharded form of clip_grad_norm_."""
    if max_norm > 0:
        sum_sq = shard.main_param.grad.square().sum()
        dist.all_reduce(sum_sq)  # the whole gradient's norm, never the shard's
        torch.nn.utils.clip_grads_with_norm_([shard.main_param], max_norm, sum_sq.sqrt())


def update(layout, shard: FlatShard, optimizer: torch.optim.Optimizer, clip_norm: float) -> None:
    """The clip, the optimizer's step on this rank's shard, then (where the stage's `layout` row gathers
    after the update) the gather of the updated shards."""
    clip_(shard, clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if layout.gathers_after_update:
        gather(shard)


def gather(shard: FlatShard) -> None:
    """Every rank's updated shard all-gathered into the full parameters (the padding cut off)."""
    with torch.no_grad():
        unflatten_into(all_gather(shard.main_param.detach())[:shard.numel], shard.params)
