"""Canonical sync BatchNorm (`reduction="canonical"` on a model with BatchNorm, issue 16's last gap).

The definition (docs/CANONICAL.md, "BatchNorm statistics (sync)"; jaxdp/canonical/batchnorm.py is the JAX twin):
per micro-batch, with T = the canonical tree over all S shards (this rank's subtree, then across ranks),
1. F_k(theta, sigma): shard k's forward in which BatchNorm layer l normalises with given statistics
   sigma_l = (mu_l, v_l), by torch's BatchNorm in eval mode with sigma_l as its running statistics and stand-ins
   (w_l, beta_l) for its weight and bias (`given.leaf_affine`, once per micro-batch), and reports (sum z,
   sum (z - mu_l)^2) over the shard's rows (`batchnorm.given`);
2. statistics, layer by layer: mu_l = T(sum z) / count_l, then v_l = T(sum (z - mu_l)^2) / count_l
   (L forward passes, each stopped at layer l, its z kept for v_l's partial sums);
3. per shard one forward and backward with the final sigma: L_k, g_k = dL_k/dtheta, and the cotangents of
   the stand-ins, which are layer l's weight and bias gradients, d w_l = sum g (z - mu_l) r_l (r_l = (v_l +
   eps)^-1/2) and d beta_l = sum g, from which h_k = dL_k/dsigma = (-w_l r_l d beta_l, -w_l r_l^2 d w_l / 2)
   (`through_affine`, on all of a rank's shards at once, row by row); H = T(h_k);
4. through the statistics in reverse, l = L..1: c = (H[mu_l], H[v_l]) / count_l; per shard the
   vector-Jacobian product of both partial sums of layer l with c gives (g', h'); g_k = g_k + g'; H = H + T(h')
   (v_l's share through mu_l, -2 sum (z - mu_l) times its cotangent, is zero over the micro-batch: left out);
5. g_k and L_k go on as without BatchNorm (fold over micro-batches, the tree, / S, / A, clipping);
   the running statistics update once per micro-batch from the canonical mu_l, v_l.
Every cross-shard sum is T, so every N gets the same bits. Cost per shard and micro-batch (since the segments,
`BatchNorms.backward`): the forward once, segment by segment (each segment's layers before its start again, on no
rows where they matter only through it), the backward in L + 1 `autograd.grad` calls, one per segment, and 3L
cross-rank sums of C or 2 sum(C) floats (an all-to-all and an all-gather each).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

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
class Segment:
    """Layer l's input z for each shard of one micro-batch, each with its graph from `starts` (the leaves that
    stand for layer l-1's inputs; l = 0: None, from the data). `z` itself is the next segment's start."""
    starts: list
    z: list


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
    free: dict = field(default_factory=dict)  # segment j -> whether it runs from an empty batch (`prefix_free`)

    def shard_grads(self, module, params, x, y, loss_fn, accum: int, local: int):
        """(i, g_k, L_k) of this rank's shard i of every micro-batch, in order; after each micro-batch the
        running statistics update from its canonical statistics."""
        for xm, ym in micro_batches(x, y, accum):
            xs, ys = xm.chunk(local), ym.chunk(local)
            sigma, affines, counts, segments = self.statistics(module, xs)
            grads = self.backward(module, params, xs, ys, loss_fn, sigma, affines, counts, segments)
            for i, (g, loss) in enumerate(grads):
                yield i, g, loss
            self.last = sigma
            for bn, (mean, var), count in zip(self.running, sigma, counts, strict=True):
                batchnorm.update_running(bn, mean, var, count)

    def statistics(self, module, xs) -> tuple[list, list, list, list]:
        """sigma = [(mu_l, v_l)], the stand-ins [(w_l, beta_l)] (leaves requiring grad) the forwards normalise with,
        count_l, and the forward's `Segment`s, layer by layer: each shard's forward from layer l-1's input (a leaf)
        to layer l's, its graph kept, gives the shard's sum z and z; the tree of the sums / count is mu_l, of the
        squared deviations v_l."""
        sigma, affines, counts, segments = [], [], [], []
        starts = [None] * len(xs)
        for layer, bn in enumerate(self.layers):
            sums, zs = [], []
            for x, start in zip(xs, starts, strict=True):
                _, ctx = self.segment(module, x, (sigma, affines), start, layer)
                self.check(ctx, layer + 1)
                sums.append(ctx.sums[layer][0].detach())
                zs.append(ctx.inputs[layer])
            count = ctx.counts[layer] * self.shards
            mean = total(sums, self.ring) / count
            squares = [given.squared_deviations(z.detach() - given.per_channel(mean, z)) for z in zs]
            sigma.append((mean, total(squares, self.ring) / count))
            affines.append(given.leaf_affine(bn, mean))
            counts.append(count)
            segments.append(Segment(starts, zs))
            starts = [z.detach().requires_grad_() for z in zs]
        return sigma, affines, counts, segments

    def backward(self, module, params, xs, ys, loss_fn, sigma, affines, counts, segments) -> list:
        """(g_k, L_k) of this rank's shards: the last segment's forward to the loss, then each segment's
        vector-Jacobian product, last first, the statistics' cotangent summed over all shards by the tree before
        the segment that made them (docstring, step 4)."""
        leaves = [t for pair in affines for t in pair]
        last = len(self.layers)
        starts = [z.detach().requires_grad_() for z in segments[-1].z]
        outputs, losses = [], []
        for x, y, start in zip(xs, ys, starts, strict=True):
            out, ctx = self.segment(module, x, (sigma, affines), start, last)
            loss = C.scalar(loss_fn(out, y))
            self.check(ctx, last)
            outputs.append(loss)
            losses.append(loss.detach())
        d = [torch.ones_like(loss) for loss in outputs]
        grads, held = [[None] * len(params) for _ in xs], [[None] * len(leaves) for _ in xs]
        index = {id(p): j for j, p in enumerate(params)}
        for layer in reversed(range(last + 1)):
            ins = starts if layer == last else segments[layer].starts
            outs = outputs if layer == last else segments[layer].z
            if layer < last:
                c = self.through_affine(layer, sigma[layer], affines[layer], held, grads, index) / counts[layer]
                c_mean, c_var = c.chunk(2)
                c = (c_mean, 2 * c_var)
                d = [share(z.detach(), sigma[layer][0], c).add_(dz) for dz, z in zip(d, outs, strict=True)]
            for k, (out, start) in enumerate(zip(outs, ins, strict=True)):
                wrt = [*params, *leaves, *([] if start is None else [start])]
                got = torch.autograd.grad(out, wrt, grad_outputs=d[k], allow_unused=True)
                accumulate(grads[k], got[:len(params)])
                accumulate(held[k], got[len(params):len(params) + len(leaves)])
                d[k] = None if start is None else torch.zeros_like(start) if got[-1] is None else got[-1]
        return [(dense(g, params), loss) for g, loss in zip(grads, losses, strict=True)]

    def through_affine(self, layer: int, stats: tuple, pair: tuple, held: list, grads: list, index: dict):
        """Layer `layer`'s stand-ins' cotangents of every shard (`held`): its weight and bias gradients, added to
        each shard's `grads`, and through `stats_vjp` (all shards' rows at once) H_l = T([d mu_l, d v_l]) over all
        shards (every rank)."""
        bn, rows = self.layers[layer], []
        for j, leaf in enumerate(pair):
            rows.append(torch.stack([leaf.new_zeros(leaf.shape) if h[2 * layer + j] is None else h[2 * layer + j]
                                     for h in held]))
        d_weight, d_bias = rows
        for p, rows_p in ((bn.weight, d_weight), (bn.bias, d_bias)):
            if p is not None and p.requires_grad:
                for k, g in enumerate(grads):
                    accumulate_one(g, index[id(p)], rows_p[k])
        d_mean, d_var = stats_vjp(bn, stats[1], pair[0].detach(), d_weight, d_bias)
        return C.all_reduce(C.tree(torch.cat([d_mean, d_var], dim=1)), ring=self.ring)

    def segment(self, module, x, norms: tuple, start, j: int):
        """Segment j's forward on one shard from `start` (layer j-1's input; None: from x): (the model's output,
        or None where layer j stopped it, and the `given` context). Its rows are x's, or none where the layers
        before segment j matter only through `start` (`prefix_free`): they then run on an empty batch."""
        rows = x if start is None or not self.prefix_free(module, x, norms, start, j) else x[:0]
        return run_given(module, rows, norms, None if start is None else {j - 1: start})

    def prefix_free(self, module, x, norms: tuple, start, j: int) -> bool:
        """Whether segment j's output depends on the layers before it only through its start: its forward
        from an empty batch gives the same bits as from x. Checked once per segment, without gradients; where
        not (a skip connection around a BatchNorm, a batch statistic of earlier activations), the segment runs
        those layers again from x."""
        if j not in self.free:
            with torch.no_grad():
                full = segment_output(*run_given(module, x, norms, {j - 1: start.detach()}), j)
                try:
                    empty = segment_output(*run_given(module, x[:0], norms, {j - 1: start.detach()}), j)
                    self.free[j] = empty.shape == full.shape and bool(torch.equal(empty, full))
                except (RuntimeError, ValueError, IndexError):  # a shape the empty batch broke: not free
                    self.free[j] = False
        return self.free[j]

    def check(self, ctx: batchnorm.Given, calls: int) -> None:
        if len(ctx.layers) != calls or ctx.layers != self.layers[:calls]:
            raise C.CanonicalError(f"reduction='canonical' needs each of the model's {len(self.layers)} BatchNorm "
                                   f"layers called once per forward, in registration order; this forward called "
                                   f"{len(ctx.layers)}; use reduction='native' for this model")


def stats_vjp(bn, var, weight, d_weight, d_bias) -> tuple:
    """(d mu, d v), each [k, C], of BatchNorm y = (z - mu) r w + beta (r = (v + eps)^-1/2) from rows [k, C] of its
    weight's and bias's gradients, d w = sum g (z - mu) r and d beta = sum g (torch's kernel): d mu = -w r d beta,
    d v = -w r^2 d w / 2; every row on its own (the same bits for a shard in any stack)."""
    r = torch.rsqrt(var + bn.eps)
    wr = weight * r
    return -wr * d_bias, d_weight * (wr * (-0.5 * r))


def accumulate_one(sums: list, j: int, g) -> None:
    """sums[j] += g (sums[j] None: g itself)."""
    sums[j] = g if sums[j] is None else sums[j] + g


def accumulate(sums: list, got) -> None:
    """sums[j] += got[j] for each tensor autograd gave (None: the segment does not reach it), in place of adding
    zeros: each gradient is the sum, last segment first, of the segments that reach its tensor."""
    for j, g in enumerate(got):
        if g is not None:
            accumulate_one(sums, j, g)


def dense(sums: list, like: list) -> torch.Tensor:
    """The sums flat, in order, zeros for a tensor no segment reached."""
    return flatten([torch.zeros_like(t) if g is None else g for g, t in zip(sums, like, strict=True)])


def share(z: torch.Tensor, mean: torch.Tensor, c: tuple) -> torch.Tensor:
    """The statistics' share of layer input z's cotangent: the vector-Jacobian product of the layer's partial sums
    (sum z, sum (z - mean)^2), mean held, with c = (c_mean, 2 c_var), their cotangents over all shards / count (each
    [C], the same for every shard; the variance's share through the mean, -2 sum (z - mean) c_var, is zero over the
    micro-batch: left out): c_mean + (z - mean) 2 c_var, in one per-channel pass, torch's BatchNorm kernel in eval
    mode with unit variance and eps 0 (its scale is 2 c_var exactly): z * 2 c_var + (c_mean - mean * 2 c_var)."""
    return F.batch_norm(z, mean, torch.ones_like(mean), c[1], c[0], False, 0.0, 0.0)


def run_given(module, rows, norms: tuple, inputs):
    """`module(rows)` with each BatchNorm layer's statistics and stand-ins given (`norms` = (sigma, the
    `given.leaf_affine`s)) and the layers' `inputs`: (its output, or None where a layer stopped the forward, and
    the `given` context)."""
    sigma, affines = norms
    with batchnorm.given(sigma, inputs, affine=affines) as ctx:
        try:
            return module(rows), ctx
        except batchnorm.Stop:
            return None, ctx


def segment_output(out, ctx, j: int) -> torch.Tensor:
    """What segment j gives: the model's output (the last segment), else layer j's input."""
    return out if out is not None else ctx.inputs[j]
