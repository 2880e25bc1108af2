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
"""
from __future__ import annotations

from torch.nn.parallel import DistributedDataParallel

from .common import Parallel, make_parallel


def apply_ddp(model, bucket_mb: float):
    device_ids = [model_device(model).index] if model_device(model).type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=bucket_mb)
    # Fix the bucket layout from the first step (see the module docstring): resume stays bit for bit.
    ddp.reducer._push_all_rebuilt_params()
    return ddp


def model_device(model):
    return next(model.parameters()).device


def make(model, optimizer, opts) -> Parallel:
    ddp = apply_ddp(model, opts.bucket_mb)
    # the all-reduce runs in the last backward; ddp.parameters() are model's
    return make_parallel("ddp", ddp, model, optimizer(ddp.parameters()), opts.accum, no_sync=ddp.no_sync, wrapped=ddp)
