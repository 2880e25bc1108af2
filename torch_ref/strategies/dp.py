"""`dp`: parameter-server data parallelism (torch.nn.DataParallel's scheme, across processes).

Every rank computes the gradient of its rows; the gradients are *reduced to rank 0* (`dist.reduce`,
a sum); rank 0 alone divides by N (post-divide), clips and steps the optimizer (every rank builds
one from the factory, only the server's ever steps or holds state); the new parameters are
*broadcast* from rank 0 (`dist.broadcast`). Every byte passes through rank 0: the bottleneck DDP
removed. The traced gradient is true on rank 0; the global loss is broadcast with the parameters
(one more scalar).

Canonical: the ranks' partial sums meet on the server by the binomial tree (`collectives.reduce_to_root`,
the canonical tree across ranks, as jaxdp's dp); the server clips and steps (`canonical_sync`,
`canonical_update`); the new parameters are broadcast from it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import optim
from ..canonical import reduce as C
from ..canonical.step import Parts, clip_, plain_backward
from ..checkpoint import ModelOptimizer
from ..collectives import reduce_to_root
from .common import Strategy, grads_of, make_strategy

SERVER = 0


def canonical_sync(c, grads: torch.Tensor) -> None:
    """The partial sums meet on the server by the binomial tree (`reduce_to_root`: the canonical tree
    across ranks, N a power of two), as jaxdp's dp: one received buffer per rank, not N on the server."""
    if c.world > 1:
        grads = reduce_to_root(grads)
    if c.rank == SERVER:
        C.set_grads(c.params, C.finish_(grads, c.s, c.par.accum))  # the sum is this step's own


def canonical_update(c, clip_norm: float) -> None:
    """The server clips and steps; the new parameters are broadcast from it."""
    if c.rank == SERVER:
        clip_(c, clip_norm)
        c.par.optimizer.step()
    c.par.module.zero_grad(set_to_none=True)
    with torch.no_grad():
        for p in c.params:
            dist.broadcast(p, src=SERVER)


CANONICAL = Parts(plain_backward, canonical_sync, canonical_update)


def make(model, optimizer, opts) -> Strategy:
    n, on_server = dist.get_world_size(), dist.get_rank() == SERVER
    params = list(model.parameters())
    built = optimizer(params)  # every rank gets one (lazy state: nothing held); only the server's steps
    loss_box = []

    def sync():
        for p in params:
            dist.reduce(p.grad, dst=SERVER)  # the sum arrives on the server only
        if on_server:
            for p in params:
                p.grad /= n

    def reduce_loss(loss):
        loss = loss.clone()
        dist.reduce(loss, dst=SERVER)
        loss_box[:] = [loss / n if on_server else loss]
        return loss_box[0]

    def update(clip_norm):
        if on_server:
            optim.clip_(params, clip_norm)
            built.step()
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p in params:
                dist.broadcast(p, src=SERVER)
            dist.broadcast(loss_box.pop(), src=SERVER)  # every rank returns the global loss

    return make_strategy("dp", model, model, built, opts.accum, sync=sync, reduce_loss=reduce_loss, update=update,
                         full_grads=lambda: grads_of(model) if on_server else None,  # true on the server only
                         checkpoint=ModelOptimizer(model, built if on_server else None), canonical_parts=CANONICAL)
