"""The shared step of `reduction="canonical"` (the shard loop, the folds over micro-batches, the
all-reduce by groups, clipping), every strategy's part declared in its own file. The definition is in
`torch_ref/canonical/reduce.py`. A strategy's part is a `Parts` value its `make` hands over
(`Strategy.canonical_parts`); nothing here asks which strategy it runs.

Every strategy computes each of its shards' gradients by its own backward, folds each shard over the
micro-batches, sums its subtree locally, then keeps its own character for the rest, with the tree in
place of its sum (one communication per step, as native):
- `plain_backward` (single, dp, ddp-naive, ddp-bucket, ddp-ring, zero2): every shard by `autograd.grad`
  beside the wrapper, then the strategy's `sync` of the folded partial sums: `all_reduce_groups` (the
  canonical all-reduce per group: everything, a parameter, a bucket; ddp-ring with the hand-written
  collectives), dp's gather to the server, zero2's reduce-scatter;
- ddp, zero1 (ddp.py): DDP's reducer with a comm hook, the last shard through DDP;
- zero3 (zero3.py): FSDP2's own backward, its reduce-scatter replaced by the canonical one.
Clipping: the canonical norm of the full gradient, the factor applied element-wise to what each rank
holds (`clip_`); then the strategy's own update, unclipped.

With sync BatchNorm (torch_ref/canonical/batchnorm.py) a shard's gradient needs the other shards' statistics,
so each micro-batch's shards are computed together (`bn_backward`: statistics, backward, the statistics'
vector-Jacobian products, every cross-shard sum by the tree) on the unwrapped module (zero3: its plain
twin), then the strategy's sync, or (ddp, zero1) DDP's reducer.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist

from ..tensors import check_rows
from . import batchnorm as canonical_bn
from . import reduce as C


class Canonical:
    """The canonical step of one parallelized model (`Strategy.canonical`); `train` replaces common.train."""

    def __init__(self, par, shards=None):
        self.par, self.shards, self.parts = par, shards, par.canonical_parts
        twin = self.parts.twin
        layers = canonical_bn.batchnorms(par.module if twin is None else twin)  # refuses local ones
        self.bn = canonical_bn.BatchNorms(layers, canonical_bn.batchnorms(par.module),
                                          ring=self.parts.ring) if layers else None
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.params = list(par.module.parameters())
        self.s = self.local = None
        self.offsets, self.index, start = {}, {id(p): j for j, p in enumerate(self.params)}, 0
        for p in self.params:
            self.offsets[id(p)] = (start, start + p.numel())
            start += p.numel()
        if self.parts.setup is not None:
            self.parts.setup(self)

    def train(self, x, y, loss_fn, clip_norm: float) -> float:
        par, parts = self.par, self.parts
        with C.one_thread():
            if self.s is None:
                check_rows(len(x), par.accum, self.params[0].device)
                self.s = C.resolve_shards(self.shards, len(x) * self.world // par.accum, self.world,
                                          C.row_tokens(tuple(x.shape), not x.is_floating_point()))
                self.local = self.s // self.world
                if parts.first_step is not None:
                    parts.first_step(self)
            if self.bn is not None:
                self.bn.shards = self.s
                losses = parts.backward_bn(self, x, y, loss_fn)
            else:
                losses = parts.backward(self, x, y, loss_fn)
            loss = C.reduce_loss(losses, self.s, par.accum)
            par.grads = kept(par.full_grads()) if par.return_grads else None
            parts.update(self, clip_norm)
        return float(loss)

    def sizes(self) -> list[int]:
        return [p.numel() for p in self.params]

    def ranges(self, lists) -> list[tuple[int, int]]:
        """The flat range each list of parameters spans."""
        return [(min(self.offsets[id(p)][0] for p in ps), max(self.offsets[id(p)][1] for p in ps)) for ps in lists]


def plain_backward(c: Canonical, x, y, loss_fn) -> torch.Tensor:
    """Each shard's gradient by its own `autograd.grad` on the plain module (no wrapper, no hook), folded;
    then the strategy's sync of this rank's partial sums."""
    grads, losses = C.shard_grads(c.par.module, c.params, x, y, loss_fn, c.par.accum, c.local)
    c.parts.sync(c, grads)
    return losses


def bn_backward(c: Canonical, x, y, loss_fn, module=None) -> torch.Tensor:
    """With BatchNorm: each shard's gradient by `canonical_bn` on the plain module (or `module`, a twin
    holding the same parameters), folded; then the strategy's sync."""
    module, params = (c.par.module, c.params) if module is None else (module, list(module.parameters()))
    grads, losses = C.Folds(c.local, c.par.accum), C.Folds(c.local, c.par.accum)
    for i, g, loss in c.bn.shard_grads(module, params, x, y, loss_fn, c.par.accum, c.local):
        grads.add(i, g)
        losses.add(i, loss)
    c.parts.sync(c, grads.partial())
    return losses.partial()


def kept(grads: dict | None) -> dict | None:
    """A copy (zero3's full_tensor at N = 1 is the gradient itself, which clipping scales in place)."""
    return None if grads is None else {name: g.clone() for name, g in grads.items()}


def all_reduce_groups(c: Canonical, grads: torch.Tensor) -> None:
    """Every rank gets the full canonical gradient, reduced group by group (`Parts.groups`), written over
    this rank's partial sums (`grads`, the step's own; at N = 1 the reduction is the identity)."""
    for start, end in c.parts.groups(c):
        C.all_reduce_(grads[start:end], c.s, c.par.accum, ring=c.parts.ring)
    C.set_grads(c.params, grads)


def clip_(c: Canonical, clip_norm: float) -> None:
    """Every parameter's full `.grad` scaled by the canonical clip factor."""
    if clip_norm > 0:
        coef = C.clip_coef([p.grad for p in c.params], clip_norm)
        for p in c.params:
            p.grad.mul_(coef)


def update_replicated(c: Canonical, clip_norm: float) -> None:
    """Full gradients on every rank: clip, then the strategy's own update (zero1: ZeroRedundancyOptimizer's)."""
    clip_(c, clip_norm)
    c.par.update(0.0)  # unclipped


def whole(c: Canonical) -> list[tuple[int, int]]:
    """One group: the whole flat gradient."""
    return [(0, sum(p.numel() for p in c.params))]


class Parts(NamedTuple):
    """What a strategy hands the canonical step (declared in its own file):
    - `backward(c, x, y, loss_fn)` -> this rank's loss partial sum; its gradients reach `sync` or a hook;
    - `backward_bn(c, x, y, loss_fn)`: the same with BatchNorm;
    - `sync(c, grads)`: the folded flat partial sums -> what the strategy's `update` reads;
    - `update(c, clip_norm)`: clip by the canonical norm, then the strategy's own update;
    - `groups(c)` -> the flat ranges `all_reduce_groups` reduces one by one;
    - `ring`: cross-rank sums by the hand-written collectives (isend/irecv all-to-all, ring all-gather);
    - `setup(c)`: once, when the step is built; `first_step(c)`: once, when S is known;
    - `twin`: a plain copy of the model the BatchNorm passes run on (zero3), or None."""
    backward: Callable
    sync: Callable
    update: Callable
    backward_bn: Callable = bn_backward
    groups: Callable = whole
    ring: bool = False
    setup: Callable | None = None
    first_step: Callable | None = None
    twin: torch.nn.Module | None = None


REPLICATED = Parts(plain_backward, all_reduce_groups, update_replicated)
"""single's part, and the start of ddp-naive's, ddp-bucket's and ddp-ring's (`REPLICATED._replace(...)`)."""
