"""`ddp`: torch.nn.parallel.DistributedDataParallel, as a user writes it.

DDP registers autograd hooks that put gradients into ~25 MB buckets and all-reduce each bucket as
soon as it is full, overlapping the rest of backward; each bucket is divided by N before its
all-reduce (pre-divide). Gradient accumulation runs every micro-batch but the last under
`ddp.no_sync()`, so DDP communicates once per step; nothing is left to `sync` after backward.

One departure from a plain `DistributedDataParallel(...)`: DDP's first iteration reduces all
gradients as one bucket and then rebuilds its buckets from the order gradients became ready, so a
run resumed from a checkpoint (a fresh DDP) would sum step K+1 in another layout than the
uninterrupted run, which differs in the last bit at N >= 3 (gloo's ring chunks the buffer). We ask
the reducer for its final layout at once (`reducer._push_all_rebuilt_params()`, what DDP's own join
hook does): buckets of at most `bucket_mb` in parameter order, the same on every step of every run.

Canonical (`CANONICAL`, zero1's too): DDP's reducer with a comm hook (`bucket_hook`): every shard
but the step's last is computed beside DDP; the last runs through DDP, and each bucket DDP hands to
the hook is completed with the earlier shards' sums and reduced by the canonical all-reduce
(all-to-all, the tree, all-gather), in DDP's buckets and order, during that last backward. With
BatchNorm the last shard's gradient (from `canonical_bn`) is handed to the reducer by a backward that
yields exactly it (`backward_bn`), so the hook runs as without BatchNorm.
"""
from __future__ import annotations

import functools
import itertools

import torch
from torch.nn.parallel import DistributedDataParallel

from .. import batchnorm
from ..canonical import reduce as C
from ..canonical.folds import Owned
from ..canonical.step import Parts, update_replicated
from .common import Strategy, make_strategy


def apply_ddp(model, bucket_mb: float):
    device_ids = [model_device(model).index] if model_device(model).type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=bucket_mb)
    # Fix the bucket layout from the first step (see the module docstring): resume stays bit for bit.
    ddp.reducer._push_all_rebuilt_params()
    return ddp


def model_device(model):
    return next(model.parameters()).device


def make(model, optimizer, opts) -> Strategy:
    ddp = apply_ddp(model, opts.bucket_mb)
    # the all-reduce runs in the last backward; ddp.parameters() are model's
    return make_strategy("ddp", ddp, model, optimizer(ddp.parameters()), opts.accum, no_sync=ddp.no_sync,
                         wrapped=ddp, canonical_parts=CANONICAL)


def backward(c, x, y, loss_fn) -> torch.Tensor:
    """Canonical: each shard by its own backward; the step's last through DDP (`bucket_hook`)."""
    par, last = c.par, c.par.accum * c.local - 1
    losses, c.folds = C.Folds(c.local, par.accum), C.Folds(c.local, par.accum)
    for k, (_, i, xs, ys) in enumerate(C.shards_of(x, y, par.accum, c.local)):
        if k == last:
            c.folds.own()  # each bucket's hook then reads views of the held sums, not copies of them
        loss = C.scalar(loss_fn((par.model if k == last else par.module)(xs), ys))
        losses.add(i, loss.detach())
        if k == last:
            loss.backward()  # DDP's reducer: its buckets go through bucket_hook
        else:
            c.folds.add(i, C.grad_of(loss, c.params))
    c.folds = None  # the held sums, done with: not kept through the update
    return losses.partial()


def backward_bn(c, x, y, loss_fn) -> torch.Tensor:
    """Canonical with BatchNorm: every shard's gradient by `canonical_bn` beside DDP; the step's last is
    then handed to DDP's reducer (`bucket_hook`) by a backward whose gradient is exactly it."""
    par, last = c.par, c.par.accum * c.local - 1
    losses, c.folds = C.Folds(c.local, par.accum), C.Folds(c.local, par.accum)
    for k, (i, g, loss) in enumerate(c.bn.shard_grads(par.module, c.params, x, y, loss_fn, par.accum, c.local)):
        losses.add(i, loss)
        if k == last:
            last_g = g
        else:
            c.folds.add(i, g)
    with batchnorm.given(c.bn.last):  # DDP's forward readies its reducer; BatchNorm changes nothing here
        par.model(x.chunk(par.accum * c.local)[-1])
    pieces = last_g.split(c.sizes())
    torch.autograd.backward([p.view_as(p) for p in c.params], [t.view_as(p) for p, t in
                                                               zip(c.params, pieces, strict=True)])
    c.folds = None
    return losses.partial()


def bucket_hook(c, bucket):  # (no annotations: DDP checks them, and these are strings)
    """DDP's comm hook: `bucket` holds the step's last shard's gradient of its parameters (in bucket
    order); it completes that shard's fold, the folds of this bucket's elements go through this rank's
    subtree and the canonical all-reduce, and DDP writes the result into `.grad`."""
    folds = c.folds.pending(functools.partial(bucket_part, c, bucket.parameters()))
    folds.add(c.local - 1, bucket.buffer())
    future = torch.futures.Future()
    # DDP reads the hook's result by offsets into its storage (as_strided), so the result must begin its
    # storage: at N > 1 the all-gathered buffer does (divided in place); at N = 1 it is the folds' own sum,
    # divided in place for the first bucket (its view begins the buffer), copied for the others (views into the
    # middle of a buffer: measured, those came back wrong in place).
    total = C.all_reduce(folds.partial(read_only=c.world > 1))  # N > 1: only read (the result is a new buffer)
    own = total.storage_offset() == 0
    future.set_result((C.finish_ if own else C.finish)(total, c.s, c.par.accum))
    return future


def bucket_part(c, params, value) -> Owned:
    """A bucket's elements of a sum (flat, or a list per parameter), in bucket order, in a buffer the hook
    may add into: a view of an `Owned` flat sum where they are one slice in order (each bucket's hook adds
    into its own part), else a copy."""
    if isinstance(value, (list, tuple)):
        return Owned(torch.cat([value[c.index[id(p)]].reshape(-1) for p in params]))
    flat, ranges = value.flat if isinstance(value, Owned) else value, [c.offsets[id(p)] for p in params]
    if isinstance(value, Owned) and all(b == a2 for (_, b), (a2, _) in itertools.pairwise(ranges)):
        return Owned(flat[ranges[0][0]:ranges[-1][1]])
    return Owned(torch.cat([flat[a:b] for a, b in ranges]))


def setup(c) -> None:
    """Canonical: DDP's buckets go through `bucket_hook`."""
    c.par.model.register_comm_hook(c, bucket_hook)


def _synced_in_hook(c, grads) -> None:
    """Nothing to sync after backward: the hook reduced every bucket."""


CANONICAL = Parts(backward, _synced_in_hook, update_replicated, backward_bn=backward_bn, setup=setup)
