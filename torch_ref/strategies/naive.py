"""`ddp-naive`: Picotron's naive data parallelism, hand-written: one hook per parameter that
all-reduces its gradient and then divides by N (post-divide). Not used in practice (one message
per parameter, nothing bucketed), but the clearest starting point.

Picotron hooks the gradient *before* it is accumulated into `.grad`, which under `no_sync` would
all-reduce only the last micro-batch's contribution; here the hook is a post-accumulate-grad hook,
so it sees (and all-reduces) the gradient accumulated over all micro-batches of the step.

Canonical: the canonical all-reduce per parameter, in backward order (`groups`), after backward.
"""
from __future__ import annotations

import torch.distributed as dist
from torch import nn

from ..canonical.step import REPLICATED
from . import common
from .common import Strategy, make_strategy


def groups(c) -> list[tuple[int, int]]:
    """Canonical: one group per parameter, in backward (reverse) order."""
    return c.ranges([[p] for p in reversed(c.params)])


CANONICAL = REPLICATED._replace(groups=groups)


class DataParallelNaive(nn.Module):
    """Wraps a module; after backward every `.grad` is the mean over the ranks."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.require_backward_grad_sync = True  # False inside no_sync()
        self.world_size = dist.get_world_size()
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._all_reduce_grad)

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def _all_reduce_grad(self, p):
        if self.require_backward_grad_sync:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= self.world_size

    def no_sync(self):
        return common.no_sync(lambda on: setattr(self, "require_backward_grad_sync", on))


def make(model, optimizer, opts) -> Strategy:
    dp_model = DataParallelNaive(model)
    return make_strategy("ddp-naive", dp_model, model, optimizer(model.parameters()), opts.accum,
                         no_sync=dp_model.no_sync, wrapped=dp_model, canonical_parts=CANONICAL)
