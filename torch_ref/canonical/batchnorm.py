"""Canonical sync BatchNorm (`reduction="canonical"` on a model with BatchNorm, issue 16's last gap).

The definition (docs/CANONICAL.md, "BatchNorm statistics (sync)"; jaxdp/canonical/batchnorm.py is the JAX twin):
per micro-batch, with T = the canonical tree over all S shards (this rank's subtree, then across ranks),
1. F_k(theta, sigma): shard k's forward in which BatchNorm layer l normalises with given statistics
   sigma_l = (mu_l, v_l) and reports (sum z, sum (z - mu_l)^2) over the shard's rows (`batchnorm.given`);
2. statistics, layer by layer: mu_l = T(sum z) / count_l, then v_l = T(sum (z - mu_l)^2) / count_l
   (L forward passes, each stopped at layer l, its z kept for v_l's partial sums);
3. per shard one forward and backward with the final sigma: L_k, g_k = dL_k/dtheta, h_k = dL_k/dsigma;
   H = T(h_k);
4. through the statistics in reverse, l = L..1: c = (H[mu_l], H[v_l]) / count_l; per shard the
   vector-Jacobian product of both partial sums of layer l with c gives (g', h'); g_k = g_k + g'; H = H + T(h')
   (v_l's share through mu_l, -2 sum (z - mu_l) times its cotangent, is zero over the micro-batch: left out);
5. g_k and L_k go on as without BatchNorm (fold over micro-batches, the tree, / S, / A, clipping);
   the running statistics update once per micro-batch from the canonical mu_l, v_l.
Every cross-shard sum is T, so every N gets the same bits. Cost per shard and micro-batch: L truncated
forward passes, one forward and backward, L vector-Jacobian products (L + 1 autograd calls over one
retained graph), and 3L + 1 cross-rank sums of C or 2 sum(C) floats (an all-to-all and an all-gather each).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import batchnorm
from ..models import given
from ..tensors import flatten, micro_batches
from . import reduce as C


def batchnorms(module: torch.nn.Module) -> list:
    """The model's BatchNorm layers (registration order), each torch_ref's with sync (`torch_ref.batchnorm`:
    BatchNorm1d/2d/3d, SyncBatchNorm); any other BatchNorm is a `CanonicalError` naming the fix."""
    found = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in found:
        if not isinstance(m, batchnorm.Synced):
            raise C.CanonicalError(f"reduction='canonical' does not cover {type(m).__name__} (only torch_ref's "
                                   f"synchronised BatchNorm: torch_ref.batchnorm.convert_sync_batchnorm(model)); "
                                   f"use it, or reduction='native'")
        if not m.sync:
            raise C.CanonicalError("reduction='canonical' needs BatchNorm statistics over the whole micro-batch, not "
                                   "per rank: use --batchnorm sync, or reduction='native'")
    return found


def total(values: list, ring: bool = False) -> torch.Tensor:
    """T: this rank's shards' values by its subtree, then the tree across ranks; every rank gets it."""
    return C.all_reduce(C.tree(torch.stack(values)), ring=ring)


@dataclass
class Shard:
    """One shard's final pass: the BatchNorm partial sums (its graph kept), g_k, h_k and L_k."""
    sums: list
    g: torch.Tensor
    h: torch.Tensor
    loss: torch.Tensor


@dataclass
class BatchNorms:
    """The canonical BatchNorm of one model: `layers` (the module's BatchNorm layers, registration order) and
    `running` (the ones whose running statistics update: the same, or under zero3 the sharded model's,
    while `layers` belong to its plain twin); `shards` S; `ring`: cross-rank sums by ddp-ring's collectives."""
    layers: list
    running: list
    shards: int = 0
    ring: bool = False
    last: list = field(default_factory=list)  # the last micro-batch's statistics

    def shard_grads(self, module, params, x, y, loss_fn, accum: int, local: int):
        """(i, g_k, L_k) of this rank's shard i of every micro-batch, in order; after each micro-batch the
        running statistics update from its canonical statistics."""
        for xm, ym in micro_batches(x, y, accum):
            xs, ys = xm.chunk(local), ym.chunk(local)
            sigma, counts = self.statistics(module, xs)
            shards = self.backward(module, params, xs, ys, loss_fn, sigma, counts)
            for i, s in enumerate(shards):
                yield i, s.g, s.loss
            self.last = sigma
            for bn, (mean, var), count in zip(self.running, sigma, counts, strict=True):
                batchnorm.update_running(bn, mean.detach(), var.detach(), count)

    def statistics(self, module, xs) -> tuple[list, list]:
        """sigma = [(mu_l, v_l)] as leaves requiring grad, and count_l, layer by layer: one forward pass per
        layer (stopped there) gives each shard's sum z and its z, kept for v_l's partial sums."""
        sigma, counts = [], []
        for layer in range(len(self.layers)):
            sums, inputs = [], []
            for x in xs:
                with torch.no_grad(), batchnorm.given(sigma) as ctx:
                    try:
                        module(x)
                    except batchnorm.Stop:
                        pass
                self.check(ctx, layer + 1)
                sums.append(ctx.sums[layer][0])
                inputs.append(ctx.inputs[layer])
            count = ctx.counts[layer] * self.shards
            mean = total(sums, self.ring) / count
            squares = [given.squared_deviations(z - given.per_channel(mean, z)) for z in inputs]
            sigma.append((mean.requires_grad_(), (total(squares, self.ring) / count).requires_grad_()))
            counts.append(count)
        return sigma, counts

    def backward(self, module, params, xs, ys, loss_fn, sigma, counts) -> list[Shard]:
        """Steps 3 and 4 of the definition for this rank's shards of one micro-batch."""
        inputs = [*params, *(t for pair in sigma for t in pair)]
        shards = []
        for x, y in zip(xs, ys, strict=True):
            with batchnorm.given(sigma) as ctx:
                loss = C.scalar(loss_fn(module(x), y))
            self.check(ctx, len(self.layers))
            grads = torch.autograd.grad(loss, inputs, retain_graph=True, materialize_grads=True)
            shards.append(Shard(ctx.sums, flatten(grads[:len(params)]), flatten(grads[len(params):]), loss.detach()))
        self.through_statistics(shards, inputs, len(params), counts)
        return shards

    def through_statistics(self, shards: list[Shard], inputs: list, n: int, counts: list) -> None:
        """Step 4: each shard's g_k gains the statistics' vector-Jacobian products, one per layer (both partial
        sums at once), in reverse (`inputs`: the n parameters, then mu_1, v_1, mu_2, ...)."""
        leaves = inputs[n:]
        big_h = total([s.h for s in shards], self.ring)
        offsets = [0]
        for t in leaves:
            offsets.append(offsets[-1] + t.numel())
        for layer in reversed(range(len(self.layers))):
            c = [big_h[offsets[j]:offsets[j + 1]] / counts[layer] for j in (2 * layer, 2 * layer + 1)]  # mu_l, v_l
            hs = []
            for s in shards:
                grads = torch.autograd.grad(list(s.sums[layer]), inputs, grad_outputs=c, retain_graph=True,
                                            materialize_grads=True)
                s.g = s.g + flatten(grads[:n])
                hs.append(flatten(grads[n:]))
            big_h = big_h + total(hs, self.ring)

    def check(self, ctx: batchnorm.Given, calls: int) -> None:
        if len(ctx.layers) != calls or ctx.layers != self.layers[:calls]:
            raise C.CanonicalError(f"reduction='canonical' needs each of the model's {len(self.layers)} BatchNorm "
                                   f"layers called once per forward, in registration order; this forward called "
                                   f"{len(ctx.layers)}; use reduction='native' for this model")
