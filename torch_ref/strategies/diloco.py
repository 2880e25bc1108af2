"""`diloco`: local SGD with an outer optimizer (DiLoCo, Douillard et al. 2023, arXiv:2311.08105), the twin of
jaxdp/strategies/diloco.py. Each rank is a replica: the plain model (no DDP, no hook), K inner steps
(`inner_steps`) with the run's optimizer on its own rows, no gradient sent; after every K-th step an outer step:
- the pseudo-gradient `delta = outer - mean over ranks of the local parameters` (one all_reduce per tensor,
  pre-divided by N, as DDP divides its gradients);
- the outer optimizer, SGD with Nesterov momentum (`outer_lr`, `outer_momentum`): `momentum = mu momentum +
  delta`, `outer -= lr (delta + mu momentum)` (torch.optim.SGD's nesterov=True, written out so that the two
  frameworks run the same operations; mu 0 is plain SGD);
- every rank copies the new `outer` into its parameters; each keeps its own inner optimizer state.
Not meant to equal `single`; its oracles (tests/torch_ref/strategies/test_torch_diloco.py): K = 1 with outer SGD
at lr 1 and inner SGD is ddp, and in general jaxdp's one-process simulation (`jaxdp.strategies.diloco_reference`).
`full_params` is the mean over ranks of the local parameters and `full_grads` that of the local gradients
(collectives only a traced run calls); the ranks' parameters differ between outer steps by design, so the
Recorder records no parameter spread for it (`replicas_agree=False`).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from jaxdp.core.run.config import ConfigError

from .common import Strategy, apply_update, grads_of, make_strategy, params_of


def mean_over_replicas(tensors: dict) -> dict:
    """{name: the all-reduce mean}, pre-divided by N (DDP's order)."""
    n = dist.get_world_size()
    means = {name: t.detach() / n for name, t in tensors.items()}
    for t in means.values():
        dist.all_reduce(t)
    return means


@torch.no_grad()
def outer_sgd(outer: dict, momentum: dict, mean: dict, lr: float, mu: float) -> None:
    """The outer step from the replicas' `mean`, in place on `outer` and `momentum`; Nesterov when mu > 0."""
    for name, o in outer.items():
        delta = o - mean[name]
        momentum[name] = mu * momentum[name] + delta
        outer[name] = o - lr * (delta + mu * momentum[name])


def make(model, optimizer, opts) -> Strategy:
    if opts.reduction != "native":
        raise ConfigError("diloco has reduction='native' only: drop reduction='canonical'")
    inner = optimizer(model.parameters())
    outer = {name: p.detach().clone() for name, p in model.named_parameters()}
    momentum = {name: torch.zeros_like(p) for name, p in outer.items()}
    steps = [0]  # inner steps taken (the outer step follows every K-th)

    @torch.no_grad()
    def update(clip_norm: float) -> None:
        apply_update(model.parameters(), inner, clip_norm)
        steps[0] += 1
        if steps[0] % opts.inner_steps:
            return
        outer_sgd(outer, momentum, mean_over_replicas(params_of(model)), opts.outer_lr, opts.outer_momentum)
        for name, p in model.named_parameters():
            p.copy_(outer[name])

    return make_strategy("diloco", model, model, inner, opts.accum, update=update,
                         full_params=lambda: mean_over_replicas(params_of(model)),
                         full_grads=lambda: mean_over_replicas(grads_of(model)), replicas_agree=False)
