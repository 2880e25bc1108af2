"""`ddp-ring`: DDP whose all-reduce is the explicit ring from `jaxdp.collectives`: all gradients
packed into one vector (`pack`: copies at static offsets; a concatenate is a slow fusion on
XLA:CPU), ring reduce-scatter (N-1 rounds) then ring all-gather (N-1 rounds), each device sending
2(N-1)/N of the gradient bytes. Divided by N before the reduction, as in `ddp`.
"""
from __future__ import annotations

import jax

from .. import canonical
from ..collectives import pack, ring_all_gather, ring_all_reduce, unpack
from ..devices import AXIS
from .common import Strategy, replicated_data_parallel


def ring_all_reduce_mean(grads, n: int):
    leaves, treedef = jax.tree.flatten(grads)
    flat = pack([g / n for g in leaves], size=-(-sum(g.size for g in leaves) // n) * n)  # no padding copy later
    return jax.tree.unflatten(treedef, unpack(ring_all_reduce(flat, AXIS), leaves))


def make(problem, optimizer, mesh, opts, return_grads=True) -> Strategy:
    n = mesh.size
    # check_vma=False: ppermute results are "varying" to JAX even though the ring makes them equal.
    return replicated_data_parallel("ddp-ring", problem, optimizer, mesh, opts,
                                    lambda grads: ring_all_reduce_mean(grads, n),
                                    check_vma=False, return_grads=return_grads, canonical_sync=canonical_ring)


def canonical_ring(values):
    """The canonical tree with ppermutes only: the pairwise exchange, the tree, the ring all-gather."""
    return canonical.all_reduce_tree(values, AXIS, gather=lambda chunk: ring_all_gather(chunk, AXIS),
                                     exchange=lambda chunks: canonical.ppermute_exchange(chunks, AXIS))
