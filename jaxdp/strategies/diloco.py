"""`diloco`: local SGD with an outer optimizer (DiLoCo, Douillard et al. 2023, arXiv:2311.08105). Each device
is a replica that takes K inner steps (`inner_steps`) with the run's optimizer on its own rows of every batch,
sending no gradient; after every K-th step an outer step:
- the pseudo-gradient `delta = outer - mean over replicas of the local parameters` (one all-reduce, `psum` of
  the parameters pre-divided by N, as ddp divides its gradients);
- the outer optimizer, SGD with Nesterov momentum (`outer_lr`, `outer_momentum`; the paper's 0.7 and 0.9):
  `momentum = mu momentum + delta`, `outer -= lr (delta + mu momentum)` (torch.optim.SGD's nesterov=True;
  mu 0 is plain SGD);
- every replica restarts from the new `outer`; each keeps its own inner optimizer state.
A strategy from parts that exist: ddp's local gradients and update without its all-reduce, plus ten lines of
outer step. It is not meant to equal `single`; its oracles (tests/jaxdp/strategies/test_diloco.py): K = 1 with
outer SGD at lr 1 and inner SGD is ddp, and in general `reference.simulate` (one process, a loop over the
replicas' rows). Between outer steps the replicas differ: `full_params` is their mean (the trace's parameters),
and the trace's gradient is the mean of the local ones (an all-reduce that only a traced step sends).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ..core.run.config import ConfigError
from ..devices import AXIS, replicated
from . import finite
from .common import Strategy, apply_update, local_grads, put_sharded, to_numpy


class DilocoState(NamedTuple):
    params: dict          # each replica's own parameters: [N, ...] split over `data`
    opt_state: optax.OptState  # each replica's inner optimizer state, stacked the same way
    outer: dict           # the outer parameters, replicated: where every replica restarts
    momentum: dict        # the outer optimizer's momentum buffer, replicated
    step: jax.Array       # inner steps taken (the outer step follows every K-th)
    batch_stats: None = None


def outer_sgd(outer, momentum, mean, lr: float, mu: float):
    """The outer step from the replicas' `mean`: (new outer, new momentum); Nesterov when mu > 0."""
    delta = jax.tree.map(lambda o, m: o - m, outer, mean)
    momentum = jax.tree.map(lambda b, d: mu * b + d, momentum, delta)
    outer = jax.tree.map(lambda o, d, b: o - lr * (d + mu * b), outer, delta, momentum)
    return outer, momentum


def mean_over_replicas(tree, n: int):
    """The all-reduce mean, pre-divided by N (ddp's order)."""
    return lax.psum(jax.tree.map(lambda a: a / n, tree), AXIS)


def make(problem, optimizer, mesh, opts, return_grads=True) -> Strategy:
    if problem.state is not None or opts.reduction != "native":
        raise ConfigError("diloco runs no model with running statistics (BatchNorm) and reduction='native' only: "
                          "use ddp")
    n, k = mesh.size, opts.inner_steps
    own = NamedSharding(mesh, P(AXIS))

    def init(params, opt_state=None):
        params = to_numpy(params)
        outer = jax.device_put(params, replicated(mesh))
        stacked = jax.device_put(jax.tree.map(lambda a: jnp.stack([a] * n), params), own)
        inner = jax.jit(jax.vmap(optimizer.init), out_shardings=own)(stacked) if opt_state is None else \
            jax.device_put(jax.tree.map(lambda a: jnp.stack([a] * n), to_numpy(opt_state)), own)
        zeros = jax.device_put(jax.tree.map(jnp.zeros_like, params), replicated(mesh))
        return DilocoState(stacked, inner, outer, zeros, jax.device_put(jnp.zeros((), jnp.int32), replicated(mesh)))

    def outer_step(params, outer, momentum):
        outer, momentum = outer_sgd(outer, momentum, mean_over_replicas(params, n), opts.outer_lr,
                                    opts.outer_momentum)
        return outer, outer, momentum

    def device_step(params, opt_state, outer, momentum, step, x, y):
        params, opt_state = (jax.tree.map(lambda a: a[0], t) for t in (params, opt_state))
        loss, grads = local_grads(problem.loss_fn, params, x, y, opts.accum)
        params, opt_state = apply_update(optimizer, grads, opt_state, params)
        step = step + 1
        params, outer, momentum = lax.cond(step % k == 0, outer_step, lambda p, o, m: (p, o, m),
                                           params, outer, momentum)
        metrics = {"loss": lax.pmean(loss, AXIS)}  # the loss: one scalar all-reduce, for the log
        if return_grads:
            metrics["grads"] = mean_over_replicas(grads, n)
        if opts.nan_check:  # each replica's own flags (its gradient, its parameters), as ZeRO's per shard
            metrics["finite"] = finite.flags(grads, params)[..., None]
        params, opt_state = (jax.tree.map(lambda a: a[None], t) for t in (params, opt_state))
        return DilocoState(params, opt_state, outer, momentum, step), metrics

    metric_specs = {"loss": P()} | ({"grads": P()} if return_grads else {}) | \
        ({"finite": P(None, None, AXIS)} if opts.nan_check else {})
    sharded_step = jax.shard_map(device_step, mesh=mesh, out_specs=(DilocoState(P(AXIS), P(AXIS), P(), P(), P()),
                                                                     metric_specs),
                                 in_specs=(P(AXIS), P(AXIS), P(), P(), P(), P(AXIS), P(AXIS)), check_vma=False)
    step = jax.jit(lambda s, x, y: sharded_step(s.params, s.opt_state, s.outer, s.momentum, s.step, x, y),
                   donate_argnums=0)
    # the replicas' mean as the outer step and torch take it: each divided by N, then summed
    mean = jax.jit(lambda stacked: jax.tree.map(lambda a: jnp.sum(a / n, axis=0), stacked),
                   out_shardings=replicated(mesh))
    return Strategy("diloco", init, put_sharded(mesh), step, lambda s: mean(s.params))
