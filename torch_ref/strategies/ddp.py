"""`ddp`: torch.nn.parallel.DistributedDataParallel, as a user writes it.

DDP registers autograd hooks that put gradients into ~25 MB buckets and all-reduce each bucket as
soon as it is full, overlapping the rest of backward; each bucket is divided by N before its
all-reduce (pre-divide). Gradient accumulation runs every micro-batch but the last under
`ddp.no_sync()`, so DDP communicates once per step.
"""
from __future__ import annotations

from torch.nn.parallel import DistributedDataParallel

from .. import optim
from .common import Strategy, grads_of, local_grads, mean_over_ranks, metrics, params_of


def apply_ddp(model, cfg):
    device_ids = [model_device(model).index] if model_device(model).type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=cfg.bucket_mb)


def model_device(model):
    return next(model.parameters()).device


def make(model, cfg, record: bool) -> Strategy:
    ddp = apply_ddp(model, cfg)
    optimizer = optim.make(cfg, ddp.parameters())

    def step(x, y):
        loss = local_grads(ddp, x, y, cfg, no_sync=ddp.no_sync)  # the all-reduce runs in the last backward
        loss = mean_over_ranks(loss)
        grads = grads_of(model) if record else None
        optim.clip_(ddp.parameters(), cfg.clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return metrics(loss, grads)

    return Strategy("ddp", step, lambda: params_of(model))
