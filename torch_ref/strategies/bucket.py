"""`ddp-bucket`: hand-written bucketed DDP (Picotron's DataParallelBucket idea).

Parameters are grouped, in reverse `parameters()` order (the order backward produces gradients),
into buckets of at most `bucket_mb` MB (`--bucket-mb`) (a larger parameter gets a bucket of its own; the same
plan as `jaxdp.strategies.bucket.plan_buckets`). Each bucket owns one flat gradient buffer and each
parameter's `main_grad` is a view into it. A post-accumulate-grad hook adds `.grad` into
`main_grad` and frees `.grad`; in the step's last backward it also marks the parameter ready, and
the moment a bucket's last parameter is ready the bucket is divided by N (pre-divide) and its
all-reduce starts asynchronously, overlapping the rest of backward. `finish_gradient_synchronization`
waits on every bucket before the optimizer step and points `.grad` at `main_grad`. What the process
group runs is one all-reduce per bucket, of its size, in plan order, then the loss's (the gloo
events the profiler records; tests/torch_ref/strategies/test_torch_strategies.py).

Canonical: the canonical all-reduce per bucket of this plan (`groups`), after backward instead of
overlapping it.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch import nn

from .. import optim
from ..canonical.step import REPLICATED
from . import common
from .common import Strategy, make_strategy

MB = 2 ** 20


def plan_buckets(params, capacity_bytes: float) -> list[list[nn.Parameter]]:
    """Walk `params` backwards; start a new bucket when the next gradient would overflow this one."""
    buckets, current, size = [], [], 0
    for p in reversed(list(params)):
        nbytes = p.numel() * p.element_size()
        if current and size + nbytes > capacity_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


class Bucket:
    """One flat gradient buffer shared by a few parameters, all-reduced as one message."""

    def __init__(self, params, world_size: int):
        self.params = params
        self.world_size = world_size
        self.grad_data = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype,
                                     device=params[0].device)
        offset = 0
        for p in params:
            p.main_grad = self.grad_data[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        self.ready: set[int] = set()
        self.handle = None
        self.launches = 0  # all-reduces started, for the tests

    def mark_ready(self, p) -> None:
        self.ready.add(id(p))
        if len(self.ready) == len(self.params):
            self.grad_data /= self.world_size
            self.handle = dist.all_reduce(self.grad_data, async_op=True)
            self.launches += 1

    def wait(self) -> None:
        assert self.handle is not None, "a bucket was never all-reduced: did backward reach every parameter?"
        self.handle.wait()

    def reset(self) -> None:
        self.grad_data.zero_()
        self.ready.clear()
        self.handle = None


class DataParallelBucket(nn.Module):
    def __init__(self, module: nn.Module, bucket_mb: float):
        super().__init__()
        self.module = module
        self.require_backward_grad_sync = True
        world_size = dist.get_world_size()
        self.buckets = [Bucket(ps, world_size) for ps in plan_buckets(module.parameters(), bucket_mb * MB)]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        for p in module.parameters():
            p.register_post_accumulate_grad_hook(self._accumulate)

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def _accumulate(self, p):
        p.main_grad.add_(p.grad)
        p.grad = None
        if self.require_backward_grad_sync:
            self._bucket_of[id(p)].mark_ready(p)

    def no_sync(self):
        return common.no_sync(lambda on: setattr(self, "require_backward_grad_sync", on))

    def finish_gradient_synchronization(self) -> None:
        for bucket in self.buckets:
            bucket.wait()
        for p in self.module.parameters():
            p.grad = p.main_grad

    def zero_grad(self) -> None:
        for p in self.module.parameters():
            p.grad = None
        for bucket in self.buckets:
            bucket.reset()


def groups(dp_model: DataParallelBucket, c) -> list[tuple[int, int]]:
    """Canonical: one group per bucket of the plan, in plan (backward) order."""
    return c.ranges([b.params for b in dp_model.buckets])


def make(model, optimizer, opts) -> Strategy:
    dp_model = DataParallelBucket(model, opts.bucket_mb)
    built = optimizer(model.parameters())

    def update(clip_norm):
        optim.clip_(model.parameters(), clip_norm)
        built.step()
        dp_model.zero_grad()

    # buckets launch in the last backward; finish_gradient_synchronization waits for them
    return make_strategy("ddp-bucket", dp_model, model, built, opts.accum, no_sync=dp_model.no_sync,
                         sync=dp_model.finish_gradient_synchronization, update=update, wrapped=dp_model,
                         canonical_parts=REPLICATED._replace(groups=functools.partial(groups, dp_model)))
