"""The catalogue's optimizer, loss and data bugs in torch_ref (`torch_bugs.PATCHES` holds them): the optimizer as
the user's code builds it (`built`: a patch of `torch_ref.api._checked`, through which every strategy calls the
user's factory, the CLI's `optim.factory` included), the loss scale's backward, the data sharding
(`jaxdp.core.run.data.part_rows`, the one layout of the CLI and the transformers runner) and the micro-batches of
accumulation. Test-only: applied in the rank that runs the bug."""
from __future__ import annotations

import numpy as np
import torch

from jaxdp.core.run import data
from torch_ref import api
from torch_ref.strategies import common

LOSS_SCALE = 1024.0  # a static loss scale (the catalogue's, jaxdp's too)


def built(edit):
    """Patches under which the optimizer the user's factory builds is `edit(build, params)` (`build`: the
    factory, checked as torch_ref checks it)."""
    checked = api._checked

    def patched(factory):
        build = checked(factory)
        return lambda params: edit(build, params)

    return [(api, "_checked", patched)]


def with_groups(**values):
    """The optimizer built with `values` (e.g. eps, betas) in every parameter group, as a constructor call
    that passes them does."""
    def edit(build, params):
        opt = build(params)
        for group in opt.param_groups:
            group.update(values)
        opt.defaults.update(values)
        return opt

    return built(edit)


def decay_wrong_set():
    """The optimizer built with nanoGPT's two groups (weight decay on the matrices only, none on biases and
    norm scales) where the run decays every parameter."""
    def edit(build, params):
        params = list(params)
        return build([{"params": [p for p in params if p.ndim >= 2]},
                      {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}])

    return built(edit)


def adam_beta_typo():
    """Adam's beta2 0.99 where 0.999 was meant."""
    return with_groups(betas=(0.9, 0.99))


class _Scaled(torch.autograd.Function):
    """The loss unchanged forward, its gradient times LOSS_SCALE backward: `scaler.scale(loss).backward()`
    with the logged loss the unscaled one."""

    @staticmethod
    def forward(ctx, loss):
        return loss.view_as(loss)

    @staticmethod
    def backward(ctx, grad):
        return grad * LOSS_SCALE


def loss_scale_kept():
    """Each micro-batch's backward from the loss times the loss scale, the gradients never unscaled
    (`optimizer.step()` called where `scaler.step(optimizer)` unscales first)."""
    local_grads = common.local_grads

    def scaled(model, x, y, loss_fn, accum, *args, **kw):
        return local_grads(model, x, y, lambda out, t: _Scaled.apply(loss_fn(out, t)), accum, *args, **kw)

    return [(common, "local_grads", scaled)]


def overlapping_part_rows(a: np.ndarray, part: int, parts: int, accum: int) -> np.ndarray:
    """`data.part_rows` off by one: in each micro-batch every part but the last starts one row late, reading
    the next part's first row; each part's first row but the last part's is never read."""
    micro = a.reshape(accum, -1, *a.shape[1:])
    size = micro.shape[1] // parts
    start = part * size + (part < parts - 1)
    return micro[:, start:start + size].reshape(-1, *a.shape[1:])


def overlapping_rows():
    return [(data, "part_rows", overlapping_part_rows)]


def stale_micro_batch():
    """Accumulation reads the first micro-batch twice and the second never (an index that lags by one)."""
    micro_batches = common.micro_batches

    def lagging(x, y, accum):
        parts = list(micro_batches(x, y, accum))
        return parts[:1] + parts[:-1] if accum > 1 else parts

    return [(common, "micro_batches", lagging)]


PATCHES = {
    "loss-scale-kept": loss_scale_kept,
    "decay-wrong-set": decay_wrong_set,
    "adam-beta-typo": adam_beta_typo,
    "overlapping-rows": overlapping_rows,
    "stale-micro-batch": stale_micro_batch,
}
