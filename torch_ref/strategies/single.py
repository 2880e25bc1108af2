"""`single`: one process, the whole global batch, plain torch. The oracle every strategy must equal."""
from __future__ import annotations

from ..canonical.step import REPLICATED
from .common import Strategy, make_strategy


def make(model, optimizer, opts) -> Strategy:
    return make_strategy("single", model, model, optimizer(model.parameters()), opts.accum,
                         reduce_loss=lambda loss: loss,  # no process group needed
                         canonical_parts=REPLICATED)  # canonical: the tree on the rank; nothing crosses a rank
