"""The catalogue's bugs (`tests.mutations`) in torch_ref, the twin of `jax_bugs.py`: each a function
returning the (object, attribute, value) patches that put the bug into torch_ref's strategy code, applied
in the rank that runs it; and `collective_dtypes`, what the process group's collectives receive (the
fp32-reduction check on the torch side). Test-only: it lives in the harness, never in torch_ref."""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from jaxdp.core.run import data
from torch_ref import batchnorm, models, optim, train
from torch_ref.collectives import ring_all_reduce
from torch_ref.strategies import bucket, common, ddp, ring

from . import torch_step_bugs, torch_sync_bugs
from .torch_step_bugs import built, with_groups


def missing_one_over_n():
    """ddp-ring's all-reduce sums the gradients and forgets to divide by N."""
    def ring_all_reduce_mean(grads):
        common.unflatten_into(ring_all_reduce(common.flatten(grads)), grads)

    return [(ring, "ring_all_reduce_mean", ring_all_reduce_mean)]


def _after_local_grads(then):
    """The step's `local_grads` (DDP has all-reduced by its end), followed by `then(model, accum)`."""
    local_grads = common.local_grads

    def wrapped(model, x, y, loss_fn, accum, *args, **kw):
        loss = local_grads(model, x, y, loss_fn, accum, *args, **kw)
        then(model, accum)
        return loss

    return [(common, "local_grads", wrapped)]


def summed_twice():
    """An all-reduce (sum) of every gradient on top of DDP's."""
    return _after_local_grads(lambda model, accum: [dist.all_reduce(p.grad) for p in model.parameters()])


def accum_k_minus_1():
    """The sum of the K micro-batch gradients divided by K - 1 (scaled after DDP's mean: the same)."""
    def rescale(model, accum):
        for p in model.parameters():
            p.grad.mul_(accum / max(accum - 1, 1))

    return _after_local_grads(rescale)


def clip_shard_norm():
    """zero3 (FSDP2) clips by the norm of this rank's shards (the DTensors' local parts)."""
    def clip_(params, max_norm):
        if max_norm > 0:
            params = [p for p in params if p.grad is not None]
            norm = float(sum(p.grad.to_local().double().square().sum() for p in params) ** 0.5)
            for p in params:
                p.grad.mul_(min(max_norm / (norm + 1e-6), 1.0))

    return [(optim, "clip_", clip_)]


def stale_grads():
    """The optimizer never clears the gradients: each step's `.grad` holds every earlier step's too."""
    return [(torch.optim.Optimizer, "zero_grad", lambda self, set_to_none=True: None)]


def decay_one_shard():
    """Rank 1's optimizer (zero2: its shard's) built without weight decay."""
    def edit(build, params):
        opt = build(params)
        if dist.get_rank() == 1:
            for group in opt.param_groups:
                group["weight_decay"] = 0.0
        return opt

    return built(edit)


def bucket_twice():
    """ddp-bucket all-reduces its first bucket a second time."""
    init, wait, first = bucket.Bucket.__init__, bucket.Bucket.wait, []

    def __init__(self, *args, **kw):
        init(self, *args, **kw)
        if not first:  # the first bucket made: the first one all-reduced (the last layers')
            first.append(self)

    def wait_twice(self):
        wait(self)
        if self is first[0]:
            dist.all_reduce(self.grad_data)

    return [(bucket.Bucket, "__init__", __init__), (bucket.Bucket, "wait", wait_twice)]


def bf16_hook(state, bucket):
    """A DDP communication hook that all-reduces each bucket in bf16 (torch's bf16_compress_hook,
    which wants NCCL, written for any backend)."""
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(dist.get_world_size())
    future = dist.all_reduce(compressed, async_op=True).get_future()

    def decompress(fut):
        return buffer.copy_(fut.value()[0])

    return future.then(decompress)


def bf16_reduction():
    """DDP with a bf16 communication hook: buckets all-reduced in bf16."""
    apply_ddp = ddp.apply_ddp

    def with_hook(model, bucket_mb):
        wrapped = apply_ddp(model, bucket_mb)
        wrapped.register_comm_hook(None, bf16_hook)
        return wrapped

    return [(ddp, "apply_ddp", with_hook)]


def bn_local_stats():
    """torch_ref's BatchNorm2d takes the run for one rank: under `sync`, each rank's own statistics."""
    return [(batchnorm, "distributed", lambda: False)]


class _AllReduceForwardOnly(batchnorm._AllReduceSum):
    """Sum over ranks in forward; the cotangent passes back unreduced (the backward all-reduce removed)."""

    @staticmethod
    def backward(ctx, grad):
        return grad


def bn_no_backward_reduce():
    """Sync BatchNorm's statistics all-reduced in forward only."""
    return [(batchnorm, "_AllReduceSum", _AllReduceForwardOnly)]


def fused_kernel(params: list):
    """The tensor the small optimizer bugs edit: the fused attention projection (the first matrix of D x 3D
    or 3D x D elements: torch_ref's and transformers' GPT-2 c_attn), else the first matrix after the first
    parameter (Llama's first q_proj)."""
    fused = [p for p in params if p.ndim == 2 and max(p.shape) == 3 * min(p.shape)]
    return fused[0] if fused else [p for p in params[1:] if p.ndim == 2][0]


def _edit_update(edit):
    """The optimizer with `edit(k, update, param, lr, weight_decay)` applied after each step (k from 1) to
    the update of one tensor (`fused_kernel`), as a bug in one tensor's optimizer would."""
    def made(build, params):
        opt = build(params)
        target = fused_kernel([p for g in opt.param_groups for p in g["params"]])
        group = next(g for g in opt.param_groups if any(p is target for p in g["params"]))
        before, count = {}, [0]

        def pre(optimizer, args, kwargs):
            count[0] += 1
            before[0] = target.detach().clone()

        def post(optimizer, args, kwargs):
            with torch.no_grad():
                p0 = before[0]
                target.copy_(p0 + edit(count[0], target - p0, p0, group["lr"], group["weight_decay"]))

        opt.register_step_pre_hook(pre)
        opt.register_step_post_hook(post)
        return opt

    return built(made)


def _scaled_first(u):
    """The first element's update 1 + 1e-5 times itself."""
    u = u.clone()
    u.view(-1)[0] *= 1.00001
    return u


PATCHES = {
    "lr-1.00001x": lambda: _edit_update(lambda k, u, p, lr, wd: u * 1.00001),
    "decay-skipped-once": lambda: _edit_update(lambda k, u, p, lr, wd: u + lr * wd * p if k == 2 else u),
    "adam-eps-1e-6": lambda: with_groups(eps=1e-6),
    "one-element": lambda: _edit_update(lambda k, u, p, lr, wd: _scaled_first(u) if k == 2 else u),
    "missing-1/N": missing_one_over_n,
    "summed-twice": summed_twice,
    "clip-shard-norm": clip_shard_norm,
    "accum-K-1": accum_k_minus_1,
    "stale-grads": stale_grads,
    "decay-one-shard": decay_one_shard,
    "bucket-twice": bucket_twice,
    "bf16-reduction": bf16_reduction,
    "bn-local-stats": bn_local_stats,
    "bn-no-backward-reduce": bn_no_backward_reduce,
} | torch_sync_bugs.PATCHES | torch_step_bugs.PATCHES


def collective_dtypes(rank: int, n: int, cfg, init, steps: int = 2) -> dict[str, set[str]]:
    """{process-group op: the dtypes of the tensors it received} over `steps` steps of `cfg` on this
    rank: the backend's own profiler events (`gloo:all_reduce`, `nccl:...`), which carry the tensors
    the process group was handed, DDP's reducer's buckets included."""
    from torch.profiler import ProfilerActivity

    from torch_ref.analysis.profiler import profile

    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    model = models.load_flax(models.build(cfg, dataset), init)
    strategy = train.strategy(model, cfg)
    seen: dict[str, set[str]] = {}
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for k in range(1, steps + 1):
            x, y = dataset.batch(k, cfg.batch_size)
            x = x.astype(models.numpy_master_dtype(cfg.dtype) if np.issubdtype(x.dtype, np.floating) else np.int64)
            x, y = (data.part_rows(a, rank, n, cfg.accum) for a in (x, y))  # the one layout, as training's
            strategy.step(torch.from_numpy(x), torch.from_numpy(y.astype(np.int64)))
    for e in prof.events():
        if e.name.startswith(("gloo:", "nccl:")):
            seen.setdefault(e.name, set()).update(d for d in e.input_dtypes if d)
    return seen
