"""`ddp`: every device holds the whole model, computes the gradient of its slice of the batch, and
an all-reduce (`psum` under `jax.shard_map`) averages the gradients; every device then takes the
same optimizer step. Gradients are divided by N before the all-reduce, as torch DDP does.
"""
from __future__ import annotations

import jax
from jax import lax

from .. import canonical
from ..devices import AXIS
from .common import Strategy, replicated_data_parallel


def all_reduce_mean(grads, n: int):
    return lax.psum(jax.tree.map(lambda g: g / n, grads), AXIS)


def make(problem, optimizer, mesh, opts, return_grads=True) -> Strategy:
    n = mesh.size
    return replicated_data_parallel("ddp", problem, optimizer, mesh, opts,
                                    lambda grads: all_reduce_mean(grads, n),
                                    check_vma=True, return_grads=return_grads,
                                    canonical_sync=lambda values: canonical.all_reduce_tree(values, AXIS))
