"""The catalogue's bugs in jaxdp: each a function returning the (object, attribute, value) patches
that put the bug into the strategy code (`tests.mutations.inject` applies and undoes them)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import PartitionSpec as P

from jaxdp import optim
from jaxdp.devices import AXIS
from jaxdp.models import cnn, flat_names
from jaxdp.strategies import bucket, common, ddp, zero

from . import jax_bugs_step, jax_bugs_sync
from .runs import FUSED_KERNEL


def missing_one_over_n():
    """ddp's all-reduce sums the gradients and forgets to divide by N."""
    return [(ddp, "all_reduce_mean", lambda grads, n: lax.psum(grads, AXIS))]


def summed_twice():
    """The shard_map trap: without the explicit `pcast(params, to='varying')` before `grad`, JAX
    casts the replicated parameters implicitly, whose transpose is a psum: the local gradients come
    back already summed, and ddp's all-reduce sums them again."""
    return [(jax.lax, "pcast", lambda x, axis_name, to: x)]


def clip_shard_norm():
    """ZeRO's optimizer applied to each device's shard alone (inside a shard_map, as before the
    update moved out): clipping takes the norm of the device's shard, not of the whole gradient."""
    def shard_local(optimizer, grads, opt_state, params):
        mesh = jax.typeof(jax.tree.leaves(params)[0]).sharding.mesh

        def specs(tree):
            return jax.tree.map(lambda a: P(AXIS) if a.ndim else P(), tree)

        local = jax.shard_map(lambda g, s, p: common.apply_update(optimizer, g, s, p), mesh=mesh,
                              in_specs=(specs(grads), specs(opt_state), specs(params)),
                              out_specs=(specs(params), specs(opt_state)), check_vma=False)
        return local(grads, opt_state, params)

    return [(zero.flat, "apply_global_update", shard_local)]


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
    """Coupled weight decay that device 1 skips (in a ZeRO optimizer, which runs on the global flat
    arrays, the elements of its shard; in a replicated strategy, its replica)."""
    def skip_device_1(p):
        try:  # inside a shard_map: this device's replica
            return (lax.axis_index(AXIS) != 1).astype(p.dtype)
        except NameError:  # ZeRO's global flat array [N x S]: device 1 owns elements [S, 2S)
            n = jax.typeof(p).sharding.mesh.shape.get(AXIS, 1)  # (1: no mesh, e.g. parallelize's probe)
            return (jnp.arange(p.size).reshape(p.shape) // (p.size // n) != 1).astype(p.dtype)

    def add_decayed_weights(weight_decay, mask=None):
        def update(updates, state, params):
            return jax.tree.map(lambda u, p: u + weight_decay * skip_device_1(p) * p, updates, params), state

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


def bn_local_stats():
    """cnn's BatchNorm never sees the `data` axis: under `sync` each device normalises with its own rows."""
    return [(cnn, "data_axis_bound", lambda: False)]


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _pmean_forward_only(x, axis_name):
    return lax.pmean(x, axis_name)


_pmean_forward_only.defvjp(lambda x, axis_name: (lax.pmean(x, axis_name), None),
                           lambda axis_name, _, g: (g / lax.axis_size(axis_name),))


class _LaxWithLocalBackward:
    """`jax.lax` but `pmean`, whose backward is local (no all-reduce of the cotangent)."""

    def __getattr__(self, name):
        return getattr(lax, name)

    @staticmethod
    def pmean(x, axis_name):
        return _pmean_forward_only(x, axis_name)


def bn_no_backward_reduce():
    """cnn's synchronised statistics: the forward pmean kept, its backward all-reduce removed."""
    return [(cnn, "lax", _LaxWithLocalBackward())]


def _edit_update(size: int, edit):
    """`optim.make`'s optimizer followed by `edit(k, update, param, lr, weight_decay)` on the update of
    the tensor of `size` elements (at step k, from 1), as a bug in one tensor's optimizer would."""
    make = optim.make

    def made(name, lr, weight_decay=0.0, clip_norm=0.0):
        def update(updates, count, params=None):
            return jax.tree.map(lambda u, p: edit(count + 1, u, p, lr, weight_decay) if u.size == size else u,
                                updates, params), count + 1

        edits = optax.GradientTransformation(lambda params: jnp.zeros((), jnp.int32), update)
        return optax.chain(make(name, lr, weight_decay, clip_norm), edits)

    return [(optim, "make", made)]


def lr_one_tensor():
    return _edit_update(FUSED_KERNEL, lambda k, u, p, lr, wd: u * 1.00001)


def decay_skipped_once():
    return _edit_update(FUSED_KERNEL, lambda k, u, p, lr, wd: jnp.where(k == 2, u + lr * wd * p, u))


def one_element():
    return _edit_update(FUSED_KERNEL, lambda k, u, p, lr, wd: jnp.where(k == 2, u.at[0, 0].multiply(1.00001), u))


def adam_eps():
    """optax's adam and adamw built with eps 1e-6 (torch's default and jaxdp's is 1e-8)."""
    adam, adamw = optax.adam, optax.adamw
    return [(optax, "adam", lambda *a, **kw: adam(*a, **{**kw, "eps": 1e-6})),
            (optax, "adamw", lambda *a, **kw: adamw(*a, **{**kw, "eps": 1e-6}))]


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
    "bn-local-stats": bn_local_stats,
    "bn-no-backward-reduce": bn_no_backward_reduce,
    "lr-1.00001x": lr_one_tensor,
    "decay-skipped-once": decay_skipped_once,
    "adam-eps-1e-6": adam_eps,
    "one-element": one_element,
    **jax_bugs_sync.PATCHES,
    **jax_bugs_step.PATCHES,
}
