"""`zero2`: ZeRO stage 2, hand-written: sharded gradients and optimizer state, replicated parameters.

Layout (torch's, not jaxdp's): ONE flat vector of all parameters concatenated, padded to a multiple of
N, rank i owning the i-th contiguous shard (jaxdp pads and shards each parameter flat on its own).

All parameters are viewed as one flat vector, zero-padded to a multiple of N and cut into N equal
shards; rank i owns shard i. Each rank keeps a master copy of its shard (`main_param`) and a torch
optimizer over that shard alone, so its optimizer state is 1/N of the whole. A step:
1. local gradients, accumulated without communication;
2. `grads`: `reduce_scatter` of the flat gradient (`flat.padded_flat`), divided by N first (pre-divide):
   each rank keeps only its shard of the mean gradient (`main_param.grad`) and frees the full one;
3. `step.update` (the twin of JAX's `zero/step.py`): clipping by the norm of the *whole* gradient (the
   all-reduced sum of the shards' squares), applied with torch.nn.utils.clip_grads_with_norm_, the
   sharded form of clip_grad_norm_; the optimizer step on the shard; then, as the row `layout.ZERO2`
   says, `step.gather`: `all_gather` of the updated shards into every rank's full parameters.
On gloo a reduce-scatter is an all-reduce plus a local chunk (twice the bytes of a true one).

Checkpoints (`ShardState`): the replicated parameters by name, and the optimizer state as it lives,
a shard of one flat vector per rank, saved as a 1-D DTensor of the *unpadded* length sharded along
dim 0. DTensor's uneven sharding (chunks of ceil(numel / N)) is exactly this layout's (shards of the
padded length / N, the padding at the end), so DCP writes each rank's shard and reshards it on load
at another N; the padding, always zero, is not saved.

Canonical: the canonical reduce-scatter of the same padded flat layout (all-to-all, then the tree on
this rank's chunk) into `main_param.grad`; clipping all-gathers the shard for the canonical norm.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch import nn

from ...canonical import reduce as C
from ...canonical.step import Parts, plain_backward
from ...checkpoint import materialise
from ...collectives import all_gather, reduce_scatter
from ..common import Strategy, params_of
from . import step
from .flat import my_shard, padded_flat
from .layout import ZERO2
from .step import FlatShard


def grads(shard: FlatShard, n: int) -> None:
    """After the last backward: the flat gradient / N reduce-scattered, this rank's shard of the mean as
    `main_param.grad`; the full gradients freed (only the shard stays)."""
    shard.main_param.grad = reduce_scatter(padded_flat([p.grad for p in shard.params], n) / n)
    for p in shard.params:
        p.grad = None


def canonical_grads(shard: FlatShard, c, grads: torch.Tensor) -> None:
    """`grads` under reduction="canonical": the canonical reduce-scatter of the padded flat layout."""
    shard.main_param.grad = C.finish(C.tree_scatter(C.padded(grads, c.world)), c.s, c.par.accum)


def canonical_update(shard: FlatShard, c, clip_norm: float) -> None:
    """Clip the shard by the canonical norm of the whole (gathered) gradient; then zero2's own update."""
    g = shard.main_param.grad
    if clip_norm > 0:
        full = all_gather(g)[:shard.numel]
        g.mul_(C.clip_coef(full.split([p.numel() for p in shard.params]), clip_norm))
    c.par.update(0.0)


def make(model, optimizer, opts) -> Strategy:
    n, rank = dist.get_world_size(), dist.get_rank()
    names, params = zip(*model.named_parameters(), strict=True)
    with torch.no_grad():
        main_param = nn.Parameter(my_shard(padded_flat(params, n), n, rank).clone())  # this rank's master shard
    shard = FlatShard(main_param, names, params, sum(p.numel() for p in params))
    built = optimizer([main_param])
    canonical = Parts(plain_backward, functools.partial(canonical_grads, shard),
                      functools.partial(canonical_update, shard))
    return Strategy("zero2", model, model, built, opts.accum, sync=functools.partial(grads, shard, n),
                    update=functools.partial(step.update, ZERO2, shard, built),
                    full_grads=functools.partial(step.full_grads, shard),
                    full_params=lambda: params_of(model), wrapped=built,
                    checkpoint=ShardState(model, main_param, built, shard.numel), canonical_parts=canonical)


class ShardState:
    """DCP Stateful of zero2: {'model': {name: full tensor}, 'optim': {'flat.<key>': 1-D DTensor of
    the unpadded length, or the replicated step count}}."""

    def __init__(self, model, main_param, optimizer, numel: int):
        from torch.distributed.device_mesh import init_device_mesh

        self.model, self.main_param, self.optimizer, self.numel = model, main_param, optimizer, numel
        self.mesh = init_device_mesh(main_param.device.type, (dist.get_world_size(),))
        start = dist.get_rank() * main_param.numel()
        self.valid = max(0, min(main_param.numel(), numel - start))  # this shard's unpadded elements

    def state_dict(self) -> dict:
        from torch.distributed.tensor import DTensor, Shard

        materialise(self.optimizer)
        optim_sd = {}
        for key, value in self.optimizer.state[self.main_param].items():
            if torch.is_tensor(value) and value.shape == self.main_param.shape:
                value = DTensor.from_local(value[:self.valid], self.mesh, [Shard(0)], run_check=False,
                                           shape=(self.numel,), stride=(1,))
            optim_sd[f"flat.{key}"] = value
        return {"model": {name: p.detach() for name, p in self.model.named_parameters()}, "optim": optim_sd}

    @torch.no_grad()
    def load_state_dict(self, sd: dict) -> None:
        params = list(self.model.parameters())
        for p, (name, _) in zip(params, self.model.named_parameters(), strict=False):
            p.copy_(sd["model"][name])
        n, rank = dist.get_world_size(), dist.get_rank()
        self.main_param.copy_(my_shard(padded_flat(params, n), n, rank))  # the master shard = the params'
        state = self.optimizer.state[self.main_param]
        for key, value in sd["optim"].items():
            key = key.removeprefix("flat.")
            if hasattr(value, "to_local"):  # (DCP may have loaded it in place: the view of the state)
                local = value.to_local().clone()
                state[key].zero_()  # the padding
                state[key][:self.valid].copy_(local)
            else:
                state[key].copy_(value) if torch.is_tensor(state[key]) else state.__setitem__(key, value)

