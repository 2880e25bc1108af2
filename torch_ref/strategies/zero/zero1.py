"""`zero1`: torch.distributed.optim.ZeroRedundancyOptimizer over DDP (ZeRO stage 1).

Layout (torch's, not jaxdp's): ZeroRedundancyOptimizer's partitions of *whole parameters* (greedy by
size, no parameter split); gradients and parameters stay whole and replicated. jaxdp's zero1 shards every
parameter flat (padded to a multiple of N) instead, so here the per-rank state is only roughly 1/N.

DDP all-reduces the gradients as in `ddp` (pre-divide, `no_sync` for accumulation); the optimizer
state is partitioned: each rank's ZeroRedundancyOptimizer runs the wrapped torch.optim class on its
own partition only, then broadcasts the updated parameters from their owners.

ZeroRedundancyOptimizer wants a class and its keyword arguments, the user gives a factory: the
factory is called once on a throwaway one-element parameter, and its class and `defaults` (every
hyperparameter the constructor accepts) build the real one. A factory that makes parameter groups
or an optimizer whose constructor does not take its `defaults` back is not supported here.

Canonical: ddp's part (`ddp.CANONICAL`: DDP's reducer with the canonical comm hook), then
ZeroRedundancyOptimizer's own update of the canonically clipped full gradients.
"""
from __future__ import annotations

import inspect

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

from ...checkpoint import ModelOptimizer
from ..common import Strategy, make_strategy
from ..ddp import CANONICAL as DDP_CANONICAL
from ..ddp import apply_ddp


def class_and_defaults(optimizer, like: torch.Tensor) -> tuple[type, dict]:
    """The torch.optim class `optimizer(params)` builds and the keyword arguments that rebuild it."""
    probe = optimizer([torch.nn.Parameter(torch.zeros(1, dtype=like.dtype, device=like.device))])
    accepted = inspect.signature(type(probe).__init__).parameters
    return type(probe), {k: v for k, v in probe.defaults.items() if k in accepted}


def make(model, optimizer, opts) -> Strategy:
    ddp = apply_ddp(model, opts.bucket_mb)
    optimizer_class, kwargs = class_and_defaults(optimizer, next(model.parameters()))
    zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=optimizer_class, **kwargs)
    # full gradients, so the usual clip is the global one; each rank updates its partition and
    # ZeroRedundancyOptimizer broadcasts it from the owner. The checkpoint holds this rank's
    # partition of the state (the inner torch optimizer `optim`).
    return make_strategy("zero1", ddp, model, zero, opts.accum, no_sync=ddp.no_sync, wrapped=zero,
                         checkpoint=ModelOptimizer(model, zero.optim), canonical_parts=DDP_CANONICAL)
