"""`zero1`: torch.distributed.optim.ZeroRedundancyOptimizer over DDP (ZeRO stage 1).

DDP all-reduces the gradients as in `ddp` (pre-divide, `no_sync` for accumulation); the optimizer
state is partitioned: each rank's ZeroRedundancyOptimizer runs the wrapped torch.optim class on its
own partition only, then broadcasts the updated parameters from their owners. The partition is of
*whole parameters* (greedy by size, no parameter split), unlike the flat, padded shards of `zero2`
and of the JAX side, so the per-rank state is only roughly 1/N.
"""
from __future__ import annotations

from torch.distributed.optim import ZeroRedundancyOptimizer

from .. import optim
from ..checkpoint import ModelOptimizer
from .common import Strategy, apply_update, grads_of, local_grads, mean_over_ranks, metrics, params_of
from .ddp import apply_ddp


def make(model, cfg, return_grads: bool) -> Strategy:
    ddp = apply_ddp(model, cfg)
    optimizer_class, kwargs = optim.optimizer_class(cfg)
    optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=optimizer_class, **kwargs)

    def step(x, y):
        loss = local_grads(ddp, x, y, cfg, no_sync=ddp.no_sync)
        loss = mean_over_ranks(loss)
        # full gradients, so the usual clip is the global one; each rank updates its partition and
        # ZeroRedundancyOptimizer broadcasts it from the owner (ddp.parameters() are model's)
        grads = grads_of(model) if return_grads else None  # the averaged gradient, before clipping
        apply_update(model, optimizer, cfg.clip_norm)
        return metrics(loss, grads)

    # The checkpoint holds this rank's partition of the state (the inner torch optimizer `optim`).
    return Strategy("zero1", step, lambda: params_of(model), wrapped=optimizer,
                    checkpoint=ModelOptimizer(model, optimizer.optim))
