"""BatchNorm for data parallelism in torch_ref: `BatchNorm2d(channels, sync=...)`.

An `nn.BatchNorm2d` (torch's semantics: momentum 0.1 as new = 0.9 old + 0.1 batch, running variance
from the unbiased batch variance, normalisation with the biased one, eps 1e-5) whose statistics,
with `sync=True` in a process group of more than one rank, are over every rank's rows:
- on a GPU, `nn.SyncBatchNorm`'s kernels do it (`torch_ref.cnn.for_device` converts the model; untested here);
- on the CPU nn.SyncBatchNorm refuses ("SyncBatchNorm expected input tensor to be on GPU"), so
  `sync_batch_norm` writes it out with all-reduces: the global mean (an all-reduce of the ranks'
  means / N), then the global biased variance (an all-reduce of the ranks' mean squared deviations
  from it / N): two-pass, as torch's CPU kernel and jaxdp/models/cnn.py compute it. Each all-reduce's
  backward is an all-reduce of the cotangents, so every rank's gradient includes the other ranks'
  rows' dependence on the shared statistics (what SyncBatchNorm's backward all-reduces).
With `sync=False` (or one rank) it is plain nn.BatchNorm2d: each rank its own rows (DDP's default),
after taking rank 0's running statistics (a broadcast before each training forward, which is DDP's
`broadcast_buffers=True`, done here so every strategy has it, the hand-written ones included).
Every rank must run the same forwards (two collectives per BatchNorm per micro-batch).

`given(stats)`: a context in which every `BatchNorm2d` normalises with *given* statistics instead
(`reduction="canonical"`, torch_ref/canonical_bn.py): layer l of the forward (call order) takes stats[l],
appends its per-channel partial sums over this call's rows to the context, and touches no running
statistic; a layer past the given ones (or given a mean only) reports what it can and stops the forward.
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch
import torch.distributed as dist
from torch import nn

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


class BatchNorm2d(nn.BatchNorm2d):
    """nn.BatchNorm2d with synchronised statistics on the CPU when `sync` (module docstring)."""

    def __init__(self, channels: int, sync: bool = True):
        super().__init__(channels, eps=EPS, momentum=MOMENTUM)
        self.sync = sync

    def forward(self, x):
        if _GIVEN:
            return given_batch_norm(self, _GIVEN[-1], x)
        if self.training and distributed():
            if self.sync:
                return sync_batch_norm(self, x)
            dist.broadcast(self.running_mean, 0)  # rank 0's, as DDP's broadcast_buffers=True, under every strategy
            dist.broadcast(self.running_var, 0)
        return super().forward(x)


def sync_batch_norm(bn: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    """Training-mode BatchNorm of NCHW `x` with statistics over every rank's rows (equal row counts)."""
    count = x.numel() // x.shape[1] * dist.get_world_size()
    mean = all_reduce_mean(x.mean(dim=(0, 2, 3)))
    centred = x - mean[:, None, None]
    var = all_reduce_mean(centred.square().mean(dim=(0, 2, 3)))  # biased: what normalises
    update_running(bn, mean, var, count)
    return normalise(bn, centred, var)


def normalise(bn: nn.BatchNorm2d, centred: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    return centred * torch.rsqrt(var + bn.eps)[:, None, None] * bn.weight[:, None, None] + bn.bias[:, None, None]


def update_running(bn: nn.BatchNorm2d, mean: torch.Tensor, var: torch.Tensor, count: int) -> None:
    """new = 0.9 old + 0.1 batch; the variance's batch value unbiased from the biased `var` of `count` values."""
    with torch.no_grad():
        bn.running_mean.mul_(1 - bn.momentum).add_(bn.momentum * mean)
        bn.running_var.mul_(1 - bn.momentum).add_(bn.momentum * var * (count / (count - 1)))  # unbiased
        bn.num_batches_tracked.add_(1)


class Stop(Exception):
    """A `given` forward has reached the layer whose statistic is being computed: nothing after it matters."""


@dataclasses.dataclass
class Given:
    """`stats`: (mean, var) per layer in call order, the last possibly (mean, None); filled by the forward:
    `sums` per layer called, (sum z,) or (sum z, sum (z - mean)^2) over this call's rows (N, H, W), z the
    layer's input in float32 or wider; `counts` (rows x H x W) and `layers` (the modules, in call order)."""
    stats: list
    sums: list = dataclasses.field(default_factory=list)
    counts: list = dataclasses.field(default_factory=list)
    layers: list = dataclasses.field(default_factory=list)


_GIVEN: list[Given] = []


@contextlib.contextmanager
def given(stats: list):
    """Every BatchNorm2d forward inside normalises with `stats` (`Given`); yields the `Given` it fills."""
    ctx = Given(list(stats))
    _GIVEN.append(ctx)
    try:
        yield ctx
    finally:
        _GIVEN.remove(ctx)


def given_batch_norm(bn: BatchNorm2d, ctx: Given, x: torch.Tensor) -> torch.Tensor:
    """`bn` on NCHW `x` with the context's next given statistics (`Given`); raises `Stop` past them."""
    z = x.to(torch.promote_types(x.dtype, torch.float32))
    mean, var = ctx.stats[len(ctx.sums)] if len(ctx.sums) < len(ctx.stats) else (None, None)
    ctx.counts.append(z.numel() // z.shape[1])
    ctx.layers.append(bn)
    if mean is None:
        ctx.sums.append((z.sum(dim=(0, 2, 3)),))
        raise Stop
    centred = z - mean[:, None, None]
    ctx.sums.append((z.sum(dim=(0, 2, 3)), centred.square().sum(dim=(0, 2, 3))))
    if var is None:
        raise Stop
    return normalise(bn, centred, var).to(x.dtype)

