"""BatchNorm with *given* statistics: the shard program of canonical BatchNorm (docs/CANONICAL.md,
"BatchNorm statistics"), the torch twin of jaxdp/models/given.py.

Inside `given(stats)`, every torch_ref BatchNorm layer (torch_ref/batchnorm.py) normalises with the
statistics it is given, `stats[l] = (mean, var)` for the l-th layer of the forward (call order), instead of
its rows' own, and touches no running statistic; the first layer past the given ones reports its input's
per-channel sum over this call's rows and stops the forward (`Stop`); `given(stats, {l: z})` gives layer l
the input z in place of the forward's own (a segment of the forward starting there); it normalises by torch's
own BatchNorm in eval mode, the given statistics as its running ones (one kernel each way), with the layer's
weight and bias or stand-ins for them (`leaf_affine`). Also the per-channel arithmetic both forms share
(`normalise`, the native sync form's, `reduced_dims`, `per_channel`).
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch
import torch.nn.functional as F
from torch import nn


def reduced_dims(x: torch.Tensor) -> tuple:
    """Every dimension but the channels' (dim 1): (0,) for (N, C), (0, 2, 3) for NCHW."""
    return (0, *range(2, x.dim()))


def per_channel(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-channel vector [C] shaped to broadcast against `x` (N, C, *)."""
    return v.reshape(-1, *[1] * (x.dim() - 2))


def normalise(bn: nn.modules.batchnorm._BatchNorm, centred: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    out = centred * per_channel(torch.rsqrt(var + bn.eps), centred)
    if bn.weight is None:
        return out
    return out * per_channel(bn.weight, centred) + per_channel(bn.bias, centred)


def squared_deviations(centred: torch.Tensor) -> torch.Tensor:
    """sum (z - mean)^2 per channel (dim 1) over every other dimension, from z - mean: the variance's partial sum
    (jaxdp/models/given.py's twin)."""
    return centred.square().sum(dim=reduced_dims(centred))


class Stop(Exception):
    """A `given` forward has reached the layer whose statistic is being computed: nothing after it matters."""


@dataclasses.dataclass
class Given:
    """`stats`: (mean, var) per layer in call order; filled by the forward: `sums` per layer called, () for a
    layer given its statistics, (sum z,) over this call's rows (N and every dimension after C) for the first
    one not given, which stops the forward; z the layer's input in float32 or wider (`given_inputs[l]` in place
    of the forward's own where given); `inputs` those z; `counts` (values per channel) and `layers` (the
    modules, in call order)."""
    stats: list
    sums: list = dataclasses.field(default_factory=list)
    inputs: list = dataclasses.field(default_factory=list)
    counts: list = dataclasses.field(default_factory=list)
    layers: list = dataclasses.field(default_factory=list)
    given_inputs: dict = dataclasses.field(default_factory=dict)  # layer -> its input z, replacing the forward's
    affine: list = dataclasses.field(default_factory=list)  # per layer (weight, bias), in place of the layer's own


_GIVEN: list[Given] = []  # the innermost active `Given` last


def current() -> Given | None:
    """The innermost active `Given`, or None outside every `given`."""
    return _GIVEN[-1] if _GIVEN else None


@contextlib.contextmanager
def given(stats: list, inputs: dict | None = None, affine: list | None = None):
    """Every torch_ref BatchNorm forward inside normalises with `stats` (`Given`), as torch's BatchNorm in eval
    mode with those statistics as its running ones, scaled by `affine[l]` = (weight, bias) where given (canonical:
    `leaf_affine`) or by the layer's own; layer l's input replaced by `inputs[l]` where given (a segment of the
    forward from layer l); yields the `Given` it fills."""
    ctx = Given(list(stats), given_inputs=dict(inputs or {}), affine=list(affine or []))
    _GIVEN.append(ctx)
    try:
        yield ctx
    finally:
        _GIVEN.remove(ctx)


def given_batch_norm(bn: nn.modules.batchnorm._BatchNorm, ctx: Given, x: torch.Tensor) -> torch.Tensor:
    """`bn` on `x` (N, C, *) with the context's next given statistics (`Given`); raises `Stop` past them."""
    layer = len(ctx.sums)
    z = ctx.given_inputs[layer] if layer in ctx.given_inputs else x.to(torch.promote_types(x.dtype, torch.float32))
    ctx.counts.append(z.numel() // z.shape[1])
    ctx.layers.append(bn)
    ctx.inputs.append(z)
    if layer >= len(ctx.stats):
        ctx.sums.append((z.sum(dim=reduced_dims(z)),))
        raise Stop
    ctx.sums.append(())
    if z.numel() == 0:  # a segment's layers before its start run on no rows (canonical): nothing to normalise
        return z.to(x.dtype)
    weight, bias = ctx.affine[layer] if layer < len(ctx.affine) else (bn.weight, bn.bias)
    if weight is not None and weight.dtype != z.dtype:
        weight, bias = weight.to(z.dtype), bias.to(z.dtype)
    mean, var = ctx.stats[layer]
    return F.batch_norm(z, mean, var, weight, bias, False, 0.0, bn.eps).to(x.dtype)


def leaf_affine(bn: nn.modules.batchnorm._BatchNorm, like: torch.Tensor) -> tuple:
    """Stand-ins for layer `bn`'s (weight, bias) in `like`'s dtype, detached leaves requiring grad (ones and zeros
    without affine): a forward given them normalises with them, and `autograd.grad` gives their cotangents on
    their own, those of the segment that used them (canonical: the statistics' cotangents come from them)."""
    with torch.no_grad():
        if bn.weight is None:
            weight, bias = torch.ones_like(like), torch.zeros_like(like)
        else:
            weight, bias = bn.weight.to(like.dtype, copy=True), bn.bias.to(like.dtype, copy=True)
    return weight.requires_grad_(), bias.requires_grad_()
