"""`ddp-ring`: DDP whose all-reduce is the hand-written ring of `torch_ref.collectives`: after the
last backward all gradients are flattened into one vector, divided by N (pre-divide), and summed by
ring reduce-scatter (N-1 rounds of isend/irecv) then ring all-gather (N-1 rounds); each rank sends
2(N-1)/N of the gradient bytes. Accumulation needs no `no_sync`: nothing communicates until the
explicit all-reduce.

Canonical: one canonical all-reduce of the whole gradient whose all-to-all is isend/irecv pairs and
whose all-gather is the hand-written ring (`ring=True`, also for BatchNorm's cross-rank sums).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..canonical.step import REPLICATED
from ..collectives import ring_all_reduce
from .common import Strategy, flatten, make_strategy, unflatten_into

CANONICAL = REPLICATED._replace(ring=True)


def ring_all_reduce_mean(grads: list[torch.Tensor]) -> None:
    flat = flatten(grads) / dist.get_world_size()
    unflatten_into(ring_all_reduce(flat), grads)


def make(model, optimizer, opts) -> Strategy:
    def sync():  # looked up when called: the mutation tests replace ring_all_reduce_mean
        ring_all_reduce_mean([p.grad for p in model.parameters()])

    return make_strategy("ddp-ring", model, model, optimizer(model.parameters()), opts.accum, sync=sync,
                         canonical_parts=CANONICAL)
