"""`ddp-bucket`: DDP with gradients packed into buckets of at most `--bucket-mb` and all-reduced
bucket by bucket, in reverse layer order (the order backward produces them), as PyTorch DDP and
Picotron's DataParallelBucket do: fewer, larger messages than one per parameter. A parameter larger
than a bucket gets a bucket of its own. Divided by N before the all-reduce, as in `ddp`.

In torch each bucket's all-reduce starts as soon as backward fills it; here XLA schedules the
collectives of the whole step, so the overlap is its to choose. The buckets are what we fix, and
the compiled program keeps them (tests/jaxdp/strategies/test_sync_once.py reads it): left alone, XLA:CPU's
`cpu-all-reduce-combiner` merges every bucket and the loss into one tuple all-reduce, and XLA:GPU's
combiner does the same below ~30 MiB; without an order, the scheduler reorders them under
accumulation. So each bucket's input is made to depend on the previous bucket's result (`after`),
which neither a combiner nor a scheduler can undo, and the step disables the combiner passes
(`NO_COMBINER`, per program) so that the loss's scalar all-reduce stays apart too.
"""
from __future__ import annotations

import jax
from jax import lax

from .. import canonical
from ..collectives import pack, unpack
from ..devices import AXIS
from ..models import flat_names
from .common import Strategy, replicated_data_parallel

MB = 2 ** 20
# XLA's all-reduce combiners (XLA:CPU's, XLA:GPU's current and older names) would merge the loss's
# scalar all-reduce into a bucket's; `after` already keeps the buckets apart and in order.
NO_COMBINER = {"xla_disable_hlo_passes": "cpu-all-reduce-combiner,gpu-all-reduce-combiner,all-reduce-combiner"}


def plan_buckets(nbytes: dict[str, int], order, capacity_bytes: float) -> list[list[str]]:
    """Group parameter names into buckets: walk `order` backwards, start a new bucket when the next
    gradient would overflow the current one."""
    buckets, current, size = [], [], 0
    for name in reversed(order):
        if current and size + nbytes[name] > capacity_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes[name]
    if current:
        buckets.append(current)
    return buckets


def after(x, done):
    """`x` unchanged, but computed from `done`: a collective on it can neither run before nor be
    merged with the one that produced `done`. Subtracts 0 x (a 0/1 value): XLA does not simplify a
    float multiply by zero (NaN * 0 is NaN), a 0/1 value is never NaN, and x - 0.0 is x for every x,
    signed zeros included (x + 0.0 is not: -0.0 + 0.0 is +0.0, which turned a gradient's -0.0 into
    +0.0 in the canonical buckets, where `single` keeps it)."""
    return x - (done[0] > 0).astype(x.dtype) * 0


def bucketed_all_reduce_mean(grads, buckets, n: int):
    named = flat_names(grads)
    reduced, flat = {}, None
    for bucket in buckets:
        packed = pack([named[name] / n for name in bucket])  # one copy per gradient (no concatenate)
        flat = lax.psum(packed if flat is None else after(packed, flat), AXIS)  # one all-reduce per bucket
        reduced.update(zip(bucket, unpack(flat, [named[name] for name in bucket]), strict=True))
    return jax.tree.unflatten(jax.tree.structure(grads), [reduced[name] for name in named])


def canonical_buckets(values, buckets):
    """(loss, grads) added by the canonical tree, bucket by bucket in the same order (`after` keeps
    them apart), the loss after the last bucket. A bucket's gradients go through `all_reduce_tree` (a
    large one on its own, the rest packed), not one packed vector: each element meets the same tree
    either way, so the bits are the same, without copying a large gradient into the pack and out."""
    loss, grads = values
    named = flat_names(grads)
    reduced, done = {}, None
    for bucket in buckets:
        leaves = [named[name] if done is None else after(named[name].reshape(-1), done).reshape(named[name].shape)
                  for name in bucket]  # every leaf: a large one goes through its own collectives
        out = canonical.all_reduce_tree(leaves, AXIS)
        reduced.update(zip(bucket, out, strict=True))
        done = out[-1].reshape(-1)
    loss = canonical.combine(after(loss.reshape(1), done)[0], AXIS)
    return loss, jax.tree.unflatten(jax.tree.structure(grads), [reduced[name] for name in named])


def plan(problem, bucket_mb: float) -> list[list[str]]:
    """The buckets of `problem`'s parameters (names, in the order they are all-reduced)."""
    nbytes = {name: p.size * p.dtype.itemsize for name, p in flat_names(problem.params).items()}
    return plan_buckets(nbytes, problem.order, bucket_mb * MB)


def make(problem, optimizer, mesh, opts, return_grads=True) -> Strategy:
    n = mesh.size
    buckets = plan(problem, opts.bucket_mb)
    return replicated_data_parallel("ddp-bucket", problem, optimizer, mesh, opts,
                                    lambda grads: bucketed_all_reduce_mean(grads, buckets, n),
                                    check_vma=True, return_grads=return_grads, compiler_options=NO_COMBINER,
                                    canonical_sync=lambda values: canonical_buckets(values, buckets))
