"""ZeRO's flat shards, shared by the three stages: every parameter flattened and zero-padded to a
multiple of N, device i owning the i-th contiguous shard of S = ceil(size / N) elements; the
collectives on them; the sharded `init`; and the optimizer's step on the global flat arrays.

The padding is zero in the parameters and in the gradients, so it stays zero through any element-wise
optimizer and adds nothing to norms; it is cut off (`unpad`) whenever a full array is rebuilt.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ... import collectives as ring
from ...devices import AXIS, replicated
from ..common import TrainState, apply_update, to_host, to_numpy


def shard_size(size: int, n: int) -> int:
    return -(-size // n)


class Collectives(NamedTuple):
    """The three collectives ZeRO needs, over the `data` axis, on flat 1-D arrays: two values of this
    tuple, `XLA` (the built-ins) and `RING` (`jaxdp.collectives`), chosen by `--collectives`."""
    kind: str
    all_reduce: Callable
    reduce_scatter: Callable  # pad to N x S, sum over devices, keep this device's S elements
    all_gather: Callable
    replica: str | None = None  # hsdp: the axis across the groups, over which each reduction ends (`across_groups`)


XLA = Collectives(
    "xla", lambda x: lax.psum(x, AXIS),
    lambda x: lax.psum_scatter(ring.pad_to_multiple(x, lax.axis_size(AXIS)), AXIS, tiled=True),
    lambda shard: lax.all_gather(shard, AXIS, tiled=True))
RING = Collectives(
    "ring", lambda x: ring.ring_all_reduce(x, AXIS), lambda x: ring.ring_reduce_scatter(x, AXIS),
    lambda shard: ring.ring_all_gather(shard, AXIS))
COLLECTIVES = {"xla": XLA, "ring": RING}


def across_groups(comm: Collectives, axis: str) -> Collectives:
    """`comm` within a group (over `data`), each reduction then finished across the groups (`axis`) by one
    psum of its result: hsdp's reduce-scatter is the group's reduce-scatter, then an all-reduce of the
    shard (Psi / S per device) across the groups, never of the full gradient; gathers stay in the group."""
    return comm._replace(replica=axis, all_reduce=lambda x: lax.psum(comm.all_reduce(x), axis),
                         reduce_scatter=lambda x: lax.psum(comm.reduce_scatter(x), axis))


def my_shard(full, n, multiple=None):
    """This device's shard of a full (replicated) array: elements [i S, (i+1) S) of the flat padded to a
    multiple of `multiple` (default n)."""
    flat = ring.pad_to_multiple(full, multiple or n)
    s = flat.size // n
    return lax.dynamic_slice(flat, (lax.axis_index(AXIS) * s,), (s,))


def unpad(flat, like):
    """The first prod(shape) elements of a padded flat array, reshaped like `like`."""
    return flat[:math.prod(like.shape)].reshape(like.shape)


def host_shards(tree, multiple):
    """Full host arrays -> the flat arrays padded to a multiple of `multiple` (N; canonical: BLOCKS), whose
    device-order shards we place (scalars, such as Adam's step count, stay as they are: replicated)."""
    return jax.tree.map(lambda p: np.pad(p.reshape(-1), (0, -p.size % multiple)) if p.ndim else p,
                                  to_numpy(tree))


def host_unshard(flat_tree, shapes):
    """Global [N x S] sharded arrays -> full unpadded host arrays."""
    return jax.tree.map(lambda f, shape: unpad(to_host(f), shape), flat_tree, shapes)


def host_full(a: np.ndarray, like) -> np.ndarray:
    """A saved array of this layout (a checkpoint's) -> the full array shaped like `like`: a flat padded
    one unpadded, a full one as it is."""
    return a if a.shape == like.shape else unpad(a.reshape(-1), like)


def apply_global_update(optimizer, grad_flat, opt_state, param_flat):
    """The optimizer's step on the global flat arrays (outside the shard_map): XLA partitions it."""
    return apply_update(optimizer, grad_flat, opt_state, param_flat)


def init_sharded(layout, optimizer, mesh, multiple: int):
    """`init(params, opt_state=None)`: the optimizer state on the flat layout (padded to `multiple`),
    sharded over `data` (hsdp's grid: within each group, the same in every group); the parameters as
    `layout` keeps them: replicated, or as flat shards."""
    sharded = NamedSharding(mesh, P(AXIS))
    opt_init = jax.jit(optimizer.init)

    def init(params, opt_state=None):
        flat = jax.device_put(host_shards(params, multiple), sharded)
        with jax.set_mesh(mesh):  # new arrays (a step count) need the mesh: explicit sharding
            state = opt_init(flat)  # optimizer state on the flat layout, sharded as XLA propagates it
        if opt_state is not None:  # a full (canonical) state: laid out as the fresh one
            state = jax.tree.map(lambda a, like: jax.device_put(a, like.sharding), host_shards(opt_state, multiple),
                                 state)
        if layout.shards_params:
            return TrainState(flat, state)
        return TrainState(jax.device_put(to_numpy(params), replicated(mesh)), state)
    return init
