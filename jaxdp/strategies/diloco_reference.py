"""diloco's oracle: N replicas simulated in one process, with no collective and no device placement. A loop over
the replicas' rows of each batch (`data.part_rows`: what rank i of torch_ref and device i of jaxdp get), each
replica with its own parameters and inner optimizer state; after every K-th step the outer step by optax's own
SGD (`optax.sgd(lr, momentum, nesterov=True)`, torch.optim.SGD's formula, written independently of the
strategies' `outer_sgd`), and every replica restarts from the outer parameters.

diloco is not meant to equal `single`; both frameworks' diloco must equal this, step by step
(tests/jaxdp/strategies/test_diloco.py, tests/torch_ref/strategies/test_torch_diloco.py). `simulate` yields what a
trace records: the mean loss, the mean of the local gradients, the mean of the local parameters.
"""
from __future__ import annotations

import jax
import numpy as np
import optax

from ..core.run import data
from .common import apply_update, local_grads


def mean(trees: list):
    """The mean of `trees` leaf by leaf, as the strategies take it: each divided by N, then summed in order."""
    n = len(trees)
    return jax.tree.map(lambda *leaves: sum(a / n for a in leaves), *trees)


def simulate(loss_fn, optimizer, params, batches, n: int, accum: int, inner_steps: int, outer_lr: float,
             outer_momentum: float):
    """For each (x, y) of `batches` (the global batches): (loss, grads, params), each the mean over the `n`
    simulated replicas, after that step (and its outer step when due)."""
    outer_opt = optax.sgd(outer_lr, momentum=outer_momentum or None, nesterov=outer_momentum > 0)
    outer, outer_state = params, outer_opt.init(params)
    local = [params] * n
    states = [optimizer.init(params)] * n
    for k, (x, y) in enumerate(batches, start=1):
        losses, grads = [], []
        for i in range(n):
            xi, yi = (data.part_rows(np.asarray(a), i, n, accum) for a in (x, y))
            loss, g = local_grads(loss_fn, local[i], xi, yi, accum)
            local[i], states[i] = apply_update(optimizer, g, states[i], local[i])
            losses.append(loss)
            grads.append(g)
        if k % inner_steps == 0:
            delta = jax.tree.map(lambda o, m: o - m, outer, mean(local))  # the pseudo-gradient
            updates, outer_state = outer_opt.update(delta, outer_state, outer)
            outer = optax.apply_updates(outer, updates)
            local = [outer] * n
        yield float(mean(losses)), mean(grads), mean(local)
