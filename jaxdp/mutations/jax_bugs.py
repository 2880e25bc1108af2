"""The catalogue's bugs in jaxdp: each a function returning the (object, attribute, value) patches
that put the bug into the strategy code (`jaxdp.mutations.inject` applies and undoes them)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax import lax

from .. import optim
from ..devices import AXIS
from ..models import flat_names
from ..strategies import bucket, common, ddp


def missing_one_over_n():
    """ddp's all-reduce sums the gradients and forgets to divide by N."""
    return [(ddp, "all_reduce_mean", lambda grads, n: lax.psum(grads, AXIS))]


def summed_twice():
    """The shard_map trap: without the explicit `pcast(params, to='varying')` before `grad`, JAX
    casts the replicated parameters implicitly, whose transpose is a psum: the local gradients come
    back already summed, and ddp's all-reduce sums them again."""
    return [(jax.lax, "pcast", lambda x, axis_name, to: x)]


def clip_shard_norm():
    """ZeRO's optimizer built without the mesh axis: clipping takes the norm of the device's shard."""
    return [(optim, "SHARDED_GRADIENT_STRATEGIES", ())]


def accum_k_minus_1():
    """The sum of the K micro-batch gradients divided by K - 1."""
    local_grads = common.local_grads

    def wrong(loss_fn, params, x, y, accum):
        loss, grads = local_grads(loss_fn, params, x, y, accum)
        return loss, jax.tree.map(lambda g: g * accum / max(accum - 1, 1), grads)

    return [(common, "local_grads", wrong)]


def keep_stale() -> optax.GradientTransformation:
    """Adds every earlier step's gradient to this one's, as a gradient buffer never zeroed does."""
    def update(grads, total, params=None):
        total = jax.tree.map(jnp.add, total, grads)
        return total, total

    return optax.GradientTransformation(lambda params: jax.tree.map(jnp.zeros_like, params), update)


def stale_grads():
    make = optim.make
    return [(optim, "make", lambda *args, **kw: optax.chain(keep_stale(), make(*args, **kw)))]


def decay_one_shard():
    """Coupled weight decay that device 1 skips (in a ZeRO optimizer, its shard; in a replicated
    strategy, its replica)."""
    def add_decayed_weights(weight_decay, mask=None):
        def update(updates, state, params):
            keep = (lax.axis_index(AXIS) != 1).astype(jax.tree.leaves(params)[0].dtype)
            return jax.tree.map(lambda u, p: u + weight_decay * keep * p, updates, params), state

        return optax.GradientTransformation(lambda params: optax.EmptyState(), update)

    return [(optax, "add_decayed_weights", add_decayed_weights)]


def bucket_twice():
    """ddp-bucket all-reduces its first bucket a second time."""
    reduce = bucket.bucketed_all_reduce_mean

    def wrong(grads, buckets, n):
        out = flat_names(reduce(grads, buckets, n))
        twice = {name: lax.psum(g, AXIS) if name in buckets[0] else g for name, g in out.items()}
        return jax.tree.unflatten(jax.tree.structure(grads), list(twice.values()))

    return [(bucket, "bucketed_all_reduce_mean", wrong)]


def bf16_reduction():
    """ddp casts the gradients to bf16 before the all-reduce (and back after)."""
    def all_reduce_mean(grads, n):
        return jax.tree.map(lambda g: lax.psum((g / n).astype(jnp.bfloat16), AXIS).astype(g.dtype), grads)

    return [(ddp, "all_reduce_mean", all_reduce_mean)]


PATCHES = {
    "missing-1/N": missing_one_over_n,
    "summed-twice": summed_twice,
    "clip-shard-norm": clip_shard_norm,
    "accum-K-1": accum_k_minus_1,
    "stale-grads": stale_grads,
    "decay-one-shard": decay_one_shard,
    "bucket-twice": bucket_twice,
    "bf16-reduction": bf16_reduction,
    "decay-one-replica": decay_one_shard,
}
