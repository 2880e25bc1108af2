"""`dp`: parameter-server data parallelism (torch.nn.DataParallel's scheme, across processes).

Every rank computes the gradient of its rows; the gradients are *reduced to rank 0* (`dist.reduce`,
a sum); rank 0 alone divides by N (post-divide), clips and runs the optimizer, which exists only
there; the new parameters are *broadcast* from rank 0 (`dist.broadcast`). Every byte passes
through rank 0: the bottleneck DDP removed. The loss and the traced gradient are true on rank 0.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import optim
from ..checkpoint import ModelOptimizer
from .common import Strategy, grads_of, local_grads, metrics, params_of

SERVER = 0


def make(model, cfg, return_grads: bool) -> Strategy:
    n, on_server = dist.get_world_size(), dist.get_rank() == SERVER
    params = list(model.parameters())
    optimizer = optim.make(cfg, params) if on_server else None

    def step(x, y):
        loss = local_grads(model, x, y, cfg)
        for p in params:
            dist.reduce(p.grad, dst=SERVER)  # the sum arrives on the server only
        dist.reduce(loss, dst=SERVER)
        grads = None
        if on_server:
            for p in params:
                p.grad /= n
            loss = loss / n
            grads = grads_of(model) if return_grads else None
            optim.clip_(params, cfg.clip_norm)
            optimizer.step()
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p in params:
                dist.broadcast(p, src=SERVER)
        return metrics(loss, grads)

    return Strategy(
        "dp", step, lambda: params_of(model), checkpoint=ModelOptimizer(model, optimizer)
    )  # optimizer: server only
