"""BatchNorm for data parallelism in torch_ref: `BatchNorm1d/2d/3d(features, sync=...)`, `SyncBatchNorm`,
and `convert_sync_batchnorm(model)`, the twin of `nn.SyncBatchNorm.convert_sync_batchnorm` that also runs
on the CPU (gloo) and on GPUs (NCCL).

Each layer is its torch namesake (`nn.BatchNorm1d/2d/3d`; `SyncBatchNorm` takes any input of 2 or more
dimensions, as nn.SyncBatchNorm does) with torch's semantics (momentum 0.1 as new = 0.9 old + 0.1 batch,
or the cumulative average when None; running variance from the unbiased batch variance, normalisation
with the biased one; eps 1e-5; affine and track_running_stats as given), whose statistics, with
`sync=True` in a process group of more than one rank, are over every rank's rows:
- nn.SyncBatchNorm refuses CPU tensors ("SyncBatchNorm expected input tensor to be on GPU"), and DDP
  refuses it in a CPU model, so `sync_batch_norm` writes it out with all-reduces of the default group
  (gloo or NCCL): the global mean (an all-reduce of the ranks' means / N), then the global biased variance
  (an all-reduce of the ranks' mean squared deviations from it / N): two-pass, as torch's CPU kernel and
  jaxdp/models/cnn.py compute it. Each all-reduce's backward is an all-reduce of the cotangents, so every
  rank's gradient includes the other ranks' rows' dependence on the shared statistics (what
  SyncBatchNorm's backward all-reduces). Every rank ends the forward with the same running statistics.
- (`torch_ref.models.cnn.for_device` still gives the project's `cnn` nn.SyncBatchNorm's kernels on a GPU.)
With `sync=False` (or one rank) it is the plain torch layer: each rank its own rows (DDP's default), and
after each training forward every rank takes rank 0's running statistics (a broadcast: DDP's
`broadcast_buffers=True`, done here under every strategy, the hand-written ones included, and after the
forward rather than before the next, so that the ranks agree between steps as jaxdp's do; the trace's
`spread` keys, docs/TRACE.md). Every rank must run the same forwards (two collectives per layer per
micro-batch), with the same number of rows.

`given(stats)`: a context in which every such layer normalises with *given* statistics instead
(`reduction="canonical"`, torch_ref/canonical/batchnorm.py): layer l of the forward (call order) takes stats[l],
appends its per-channel partial sums over this call's rows to the context, and touches no running
statistic; a layer past the given ones (or given a mean only) reports what it can and stops the forward.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from jaxdp.core.run.config import ConfigError

from .models import given as given_mod
from .models.given import (  # noqa: F401 (re-exported: `torch_ref.batchnorm.given` is documented)
    Given,
    Stop,
    given,
    given_batch_norm,
    normalise,
    per_channel,
    reduced_dims,
)

EPS = 1e-5
MOMENTUM = 0.1


class _AllReduceSum(torch.autograd.Function):
    """Sum over ranks; its gradient is the sum over ranks of the cotangents."""

    @staticmethod
    def forward(ctx, t):
        t = t.clone()
        dist.all_reduce(t)
        return t

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    return _AllReduceSum.apply(t) / dist.get_world_size()


def distributed() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


class Synced:
    """The forward shared by torch_ref's BatchNorm layers (module docstring); mixed into each torch class."""

    def __init__(self, num_features: int, sync: bool = True, *, eps: float = EPS, momentum: float | None = MOMENTUM,
                 affine: bool = True, track_running_stats: bool = True, device=None, dtype=None):
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine,
                         track_running_stats=track_running_stats, device=device, dtype=dtype)
        self.sync = sync

    def forward(self, x):
        if given_mod.current() is not None:
            return given_batch_norm(self, given_mod.current(), x)
        if not (self.training and distributed()):
            return super().forward(x)
        if self.sync:
            self._check_input_dim(x)
            return sync_batch_norm(self, x)
        out = super().forward(x)
        if self.track_running_stats:  # rank 0's, as DDP's broadcast_buffers=True, under every strategy
            dist.broadcast(self.running_mean, 0)
            dist.broadcast(self.running_var, 0)
        return out


class BatchNorm1d(Synced, nn.BatchNorm1d):
    """nn.BatchNorm1d ((N, C) or (N, C, L)) with synchronised statistics when `sync` (module docstring)."""


class BatchNorm2d(Synced, nn.BatchNorm2d):
    """nn.BatchNorm2d (N, C, H, W) with synchronised statistics when `sync` (module docstring)."""


class BatchNorm3d(Synced, nn.BatchNorm3d):
    """nn.BatchNorm3d (N, C, D, H, W) with synchronised statistics when `sync` (module docstring)."""


class SyncBatchNorm(Synced, nn.BatchNorm2d):
    """nn.SyncBatchNorm's twin: any input (N, C, *) of 2 or more dimensions. It is an nn.BatchNorm2d to the
    rest of torch (torch_ref.convert's rules, isinstance checks) because nn.SyncBatchNorm cannot be its
    base: DistributedDataParallel refuses an nn.SyncBatchNorm in a CPU model."""

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {x.dim()}D input)")


# torch's layer -> torch_ref's (the first match wins: torch_ref's SyncBatchNorm is also an nn.BatchNorm2d)
TWINS = ((SyncBatchNorm, SyncBatchNorm), (nn.SyncBatchNorm, SyncBatchNorm), (nn.BatchNorm1d, BatchNorm1d),
         (nn.BatchNorm2d, BatchNorm2d), (nn.BatchNorm3d, BatchNorm3d))


def convert_sync_batchnorm(module: nn.Module, process_group=None) -> nn.Module:
    """Every BatchNorm in `module` (nn.BatchNorm1d/2d/3d, nn.SyncBatchNorm, torch_ref's own), recursively,
    replaced by torch_ref's synchronised twin holding the same parameters and buffers (the same tensors:
    weight, bias, running_mean, running_var, num_batches_tracked, so requires_grad, dtype and device stay),
    eps, momentum, affine, track_running_stats and training mode. Returns `module` itself, or the new layer
    when `module` is a BatchNorm (as torch's does). Convert before `torch_ref.parallelize`."""
    if process_group is not None or getattr(module, "process_group", None) is not None:
        raise ConfigError("convert_sync_batchnorm: torch_ref's synchronised BatchNorm reduces over the default "
                          "process group (every rank); pass process_group=None (and no nn.SyncBatchNorm with one)")
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return _twin(module)
    for name, child in module.named_children():
        converted = convert_sync_batchnorm(child)
        if converted is not child:
            module.add_module(name, converted)
    return module


def _twin(bn: nn.modules.batchnorm._BatchNorm) -> nn.Module:
    cls = next((new for old, new in TWINS if isinstance(bn, old)), None)
    if cls is None:
        raise ConfigError(f"convert_sync_batchnorm: {type(bn).__name__} has no synchronised twin in torch_ref "
                          f"(nn.BatchNorm1d/2d/3d and nn.SyncBatchNorm have); build the model with one of those")
    out = cls(bn.num_features, sync=True, eps=bn.eps, momentum=bn.momentum, affine=bn.affine,
              track_running_stats=bn.track_running_stats, device="meta")
    for name in ("weight", "bias"):
        if bn.affine:
            setattr(out, name, getattr(bn, name))  # the same Parameter: requires_grad, dtype, device kept
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        if bn.track_running_stats:
            out.register_buffer(name, getattr(bn, name))
    if hasattr(bn, "qconfig"):
        out.qconfig = bn.qconfig
    return out.train(bn.training)


def sync_batch_norm(bn: nn.modules.batchnorm._BatchNorm, x: torch.Tensor) -> torch.Tensor:
    """Training-mode BatchNorm of `x` (N, C, *) with statistics over every rank's rows (equal row counts)."""
    dims = reduced_dims(x)
    count = x.numel() // x.shape[1] * dist.get_world_size()
    if count < 2:
        raise ValueError(f"expected more than 1 value per channel when training, got input size {tuple(x.shape)} "
                         f"on each of {dist.get_world_size()} ranks")
    mean = all_reduce_mean(x.mean(dim=dims))
    centred = x - per_channel(mean, x)
    var = all_reduce_mean(centred.square().mean(dim=dims))  # biased: what normalises
    update_running(bn, mean, var, count)
    return normalise(bn, centred, var)


def update_running(bn: nn.modules.batchnorm._BatchNorm, mean: torch.Tensor, var: torch.Tensor, count: int) -> None:
    """new = (1 - m) old + m batch (m = momentum, or 1 / batches seen when None); the variance's batch value
    unbiased from the biased `var` of `count` values. Nothing without running statistics."""
    if not bn.track_running_stats:
        return
    with torch.no_grad():
        bn.num_batches_tracked.add_(1)
        m = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
        bn.running_mean.mul_(1 - m).add_(m * mean)
        bn.running_var.mul_(1 - m).add_(m * var * (count / (count - 1)))  # unbiased
