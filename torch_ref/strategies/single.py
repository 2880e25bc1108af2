"""`single`: one process, the whole global batch, plain torch. The oracle every strategy must equal."""
from __future__ import annotations

from .. import optim
from ..checkpoint import ModelOptimizer
from .common import Strategy, grads_of, local_grads, metrics, params_of


def make(model, cfg, record: bool) -> Strategy:
    optimizer = optim.make(cfg, model.parameters())

    def step(x, y):
        loss = local_grads(model, x, y, cfg)
        grads = grads_of(model) if record else None
        optim.clip_(model.parameters(), cfg.clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return metrics(loss, grads)

    return Strategy("single", step, lambda: params_of(model), checkpoint=ModelOptimizer(model, optimizer))
