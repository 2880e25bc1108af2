"""`ddp-ring`: DDP whose all-reduce is the hand-written ring of `torch_ref.collectives`: after the
last backward all gradients are flattened into one vector, divided by N (pre-divide), and summed by
ring reduce-scatter (N-1 rounds of isend/irecv) then ring all-gather (N-1 rounds); each rank sends
2(N-1)/N of the gradient bytes. Accumulation needs no `no_sync`: nothing communicates until the
explicit all-reduce.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import optim
from ..checkpoint import ModelOptimizer
from ..collectives import ring_all_reduce
from .common import (
    Strategy,
    apply_update,
    flatten,
    grads_of,
    local_grads,
    mean_over_ranks,
    metrics,
    params_of,
    unflatten_into,
)


def ring_all_reduce_mean(grads: list[torch.Tensor]) -> None:
    flat = flatten(grads) / dist.get_world_size()
    unflatten_into(ring_all_reduce(flat), grads)


def make(model, cfg, return_grads: bool) -> Strategy:
    optimizer = optim.make(cfg, model.parameters())

    def step(x, y):
        loss = local_grads(model, x, y, cfg)
        ring_all_reduce_mean([p.grad for p in model.parameters()])
        loss = mean_over_ranks(loss)
        grads = grads_of(model) if return_grads else None  # the averaged gradient, before clipping
        apply_update(model, optimizer, cfg.clip_norm)
        return metrics(loss, grads)

    return Strategy("ddp-ring", step, lambda: params_of(model), checkpoint=ModelOptimizer(model, optimizer))
