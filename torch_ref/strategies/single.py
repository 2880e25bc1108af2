"""`single`: one process, the whole global batch, plain torch. The oracle every strategy must equal."""
from __future__ import annotations

from .. import optim
from ..checkpoint import ModelOptimizer
from .common import Strategy, apply_update, grads_of, local_grads, metrics, params_of


def make(model, cfg, return_grads: bool) -> Strategy:
    optimizer = optim.make(cfg, model.parameters())

    def step(x, y):
        loss = local_grads(model, x, y, cfg)
        grads = grads_of(model) if return_grads else None  # the averaged gradient, before clipping
        apply_update(model, optimizer, cfg.clip_norm)
        return metrics(loss, grads)

    return Strategy("single", step, lambda: params_of(model), checkpoint=ModelOptimizer(model, optimizer))
