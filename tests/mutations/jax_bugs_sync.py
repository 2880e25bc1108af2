"""The catalogue's gradient-synchronisation bugs in jaxdp (issue 70's classes): each a function returning the
(object, attribute, value) patches that put the bug into one function of the strategy code."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxdp import optim
from jaxdp.devices import AXIS
from jaxdp.models import flat_names, units
from jaxdp.strategies import bucket, common, ddp, ring
from jaxdp.strategies.zero import flat, zero3

from .runs import CLIP_AT, LOSS_SCALE


def hsdp_wrong_axis():
    """hsdp's reductions end within the group (over `data`): the all-reduce across the groups (`replica`)
    is never added, so each group steps with its own half of the batch."""
    return [(flat, "across_groups", lambda comm, axis: comm._replace(replica=axis))]


def zero_gather_offset():
    """zero3's all-gather puts the shards back rotated by one: device i's shard lands at i + 1's offset."""
    def gather_leaf(comm):
        def gather(shard, shape):
            return flat.unpad(jnp.roll(comm.all_gather(shard), shard.shape[0]), shape)
        return gather

    return [(zero3, "gather_leaf", gather_leaf)]


def clip_before_reduce():
    """ddp clips each device's local gradient by its own norm before the all-reduce (the optimizer's
    global clip runs after, as written)."""
    reduce = ddp.all_reduce_mean

    def all_reduce_mean(grads, n):
        norm = optim.global_norm(grads)
        scale = jnp.minimum(1.0, CLIP_AT / (norm + 1e-6)).astype(norm.dtype)
        return reduce(jax.tree.map(lambda g: g * scale.astype(g.dtype), grads), n)

    return [(ddp, "all_reduce_mean", all_reduce_mean)]


def loss_scale_kept():
    """A static loss scale (LOSS_SCALE) multiplies the loss before backward and is never divided out of
    the gradients (the loss reported is the unscaled one)."""
    local_grads = common.local_grads

    def scaled(loss_fn, params, x, y, accum):
        loss, grads = local_grads(lambda p, a, b: loss_fn(p, a, b) * LOSS_SCALE, params, x, y, accum)
        return loss / LOSS_SCALE, grads

    return [(common, "local_grads", scaled)]


def stale_micro_batch():
    """Gradient accumulation's loop reads micro-batch 0's gradient twice and never the last one's (the
    scan over micro-batches 1..K-1 fed 0..K-2)."""
    def local_grads(loss_fn, params, x, y, accum):
        grad_fn = jax.value_and_grad(loss_fn)
        xs = x.reshape(accum, x.shape[0] // accum, *x.shape[1:])
        ys = y.reshape(accum, y.shape[0] // accum, *y.shape[1:])
        loss, grads = grad_fn(params, xs[0], ys[0])

        def micro_step(carry, batch):
            micro_loss, g = grad_fn(params, *batch)
            return (carry[0] + micro_loss, jax.tree.map(jnp.add, carry[1], g)), None

        (loss, grads), _ = lax.scan(micro_step, (loss, grads), (xs[:-1], ys[:-1]))
        return loss / accum, jax.tree.map(lambda g: g / accum, grads)

    return [(common, "local_grads", local_grads)]


def bucket_missing_one_over_n():
    """ddp-bucket's first bucket is summed but not divided by N (the other buckets are)."""
    def bucketed_all_reduce_mean(grads, buckets, n):
        named = flat_names(grads)
        reduced, done = {}, None
        for i, names in enumerate(buckets):
            packed = bucket.pack([named[name] / (1 if i == 0 else n) for name in names])
            done = lax.psum(packed if done is None else bucket.after(packed, done), AXIS)
            reduced.update(zip(names, bucket.unpack(done, [named[name] for name in names]), strict=True))
        return jax.tree.unflatten(jax.tree.structure(grads), [reduced[name] for name in named])

    return [(bucket, "bucketed_all_reduce_mean", bucketed_all_reduce_mean)]


def leaf_skipped():
    """ddp-ring's reducer never all-reduces one parameter's gradient (the first leaf: its hook never
    fired): that leaf keeps device 0's local gradient, undivided."""
    reduce = ring.ring_all_reduce_mean

    def ring_all_reduce_mean(grads, n):
        leaves, treedef = jax.tree.flatten(grads)
        rest = jax.tree.leaves(reduce(leaves[1:], n))
        return jax.tree.unflatten(treedef, [leaves[0], *rest])

    return [(ring, "ring_all_reduce_mean", ring_all_reduce_mean)]


def tied_grad_once():
    """zero3 takes a weight two units use (GPT-2's `wte`: the embedding and the head) as each unit's own:
    each unit's gradient of it is reduce-scattered, and the last written wins: one use's gradient only."""
    return [(units, "shared_paths", lambda unit_list: ())]


PATCHES = {
    "hsdp-wrong-axis": hsdp_wrong_axis,
    "zero-gather-offset": zero_gather_offset,
    "clip-before-reduce": clip_before_reduce,
    "loss-scale-kept": loss_scale_kept,
    "stale-micro-batch": stale_micro_batch,
    "bucket-missing-1/N": bucket_missing_one_over_n,
    "leaf-skipped": leaf_skipped,
    "tied-grad-once": tied_grad_once,
}
