"""`single`: one process, the whole global batch, plain torch. The oracle every strategy must equal."""
from __future__ import annotations

from .common import Parallel, make_parallel


def make(model, optimizer, opts) -> Parallel:
    return make_parallel("single", model, model, optimizer(model.parameters()), opts.accum,
                      reduce_loss=lambda loss: loss)  # no process group needed
