"""`single`: one process, the whole global batch, plain torch. The oracle every strategy must equal."""
from __future__ import annotations

from .. import optim
from ..checkpoint import ModelOptimizer
from .common import Strategy, apply_update, local_grads, params_of


def make(model, cfg, record: bool) -> Strategy:
    optimizer = optim.make(cfg, model.parameters())

    def step(x, y):
        loss = local_grads(model, x, y, cfg)
        return apply_update(model, optimizer, cfg, loss, record)

    return Strategy("single", step, lambda: params_of(model), checkpoint=ModelOptimizer(model, optimizer))
