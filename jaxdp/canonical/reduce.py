"""The definition of `reduction="canonical"`: a step's gradient defined independently of the number
of devices, so that a run on N devices gives the same bits as `single` (docs/CANONICAL.md).

The global batch of a micro-batch is cut into S shards of equal rows (S a power of two, N | S);
device d holds shards [d S/N, (d+1) S/N) of every micro-batch (its `data.part_rows` block). Each
shard's mean loss and gradient come from one program (`fenced`: the same HLO on every device and N,
fenced by optimization barriers); each shard index folds its micro-batches in order (the step:
`step.py`); the S folded shards are added by one binary tree over shard index (`tree`; on a device
`streamed_tree`, the same association without stacking the shards), its lower levels on the device
and its upper levels across devices (`combine` / `combine_scatter`: an all-to-all of each device's
partial sums, the same tree on the chunk a device owns, an all-gather: an all-reduce's bytes). Then
/ S (a power of two: exact) and / A. Addition is commutative in IEEE arithmetic, so only the
association is fixed, and it is the same for every N.

Clipping uses `global_norm`: each parameter zero-padded to a multiple of BLOCKS and cut into BLOCKS
blocks, each block's squares summed by `pairsum`, the blocks by `tree`, the parameters by a left
fold; a device that holds whole blocks (ZeRO's canonical layout pads to a multiple of BLOCKS) sums
its own and the upper levels run across devices.

What the compiler had to be kept from doing (measured; docs/CANONICAL.md): XLA's algebraic
simplifier rewrites a division by a broadcast scalar into a multiplication by its reciprocal when that
broadcast is the scalar's only user, and which broadcasts are shared differs between programs (a
partitioned program's CSE merged GPT's softmax's two), so canonical steps compile with CSE off
(`compiler.py`), `single` as ddp's program on one device, and the mean and the clip fenced (`fence`); LLVM's fused
multiply-adds depend on fusion (Adam's moments), so the process runs without them
(`jaxdp.devices.request_no_fma`); and the per-shard program is the model unit by unit for every
strategy (`step.unit_value_and_grad`), as zero3 must run it, with its weight gradients' transposes folded
by hand (`models.dot_fold`; a checkpoint's body inlined behind its own barrier, docs/CANONICAL.md).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ..core.run.reduction import BLOCKS

FENCED = True  # `finish` and `clip` behind optimization barriers (False: a mutation, tests/canonical_runs.py)
PIECES = 4  # combine_scatter: the exchange in up to this many pieces, received one at a time
MIN_PIECE_BYTES = 1 << 18  # ... none smaller than this (a small model keeps one all-to-all)
PAIRED_BYTES = 1 << 20  # streamed_tree: a gradient this large adds its lowest level in unrolled pairs
ALONE_BYTES = 1 << 20  # all_reduce_tree: a leaf this large is reduced on its own, not packed


def fence(values):
    """`values` behind an optimization barrier (FENCED): what is on either side is not rewritten together."""
    return lax.optimization_barrier(values) if FENCED else values


def tree(stacked):
    """Sum over the leading axis (a power of two) by adjacent pairs, level by level."""
    def reduce(a):
        while a.shape[0] > 1:
            a = a[0::2] + a[1::2]
        return a[0]
    return jax.tree.map(reduce, stacked)


def pairsum(v):
    """Sum over the last axis: zero-pad it to a power of two, then adjacent pairs until one remains."""
    width = v.shape[-1]
    padded = 1 << max(width - 1, 0).bit_length()
    v = jnp.pad(v, [(0, 0)] * (v.ndim - 1) + [(0, padded - width)])
    while v.shape[-1] > 1:
        v = v[..., 0::2] + v[..., 1::2]
    return v[..., 0]


def blocks(flat):
    """A flat array zero-padded to a multiple of BLOCKS, as [BLOCKS, L]."""
    return jnp.pad(flat, (0, -flat.size % BLOCKS)).reshape(BLOCKS, -1)


def fenced(value_and_grad, params, x, y):
    """One shard's `value_and_grad(params, x, y)`, fenced by optimization barriers so that no fusion
    or rewrite crosses its edges: the same program wherever it runs."""
    p, xb, yb = lax.optimization_barrier((params, x, y))
    return lax.optimization_barrier(value_and_grad(p, xb, yb))


def shard_values(value_and_grad, params, xs, ys):
    """(losses [k], grads [k, ...]): each of the k shards' mean loss and gradient
    (`value_and_grad(params, x, y)`), one shard at a time by the same program (`fenced`)."""
    return lax.map(lambda batch: fenced(value_and_grad, params, *batch), (xs, ys))


def streamed_tree(leaf, k: int, like):
    """`tree` of [leaf(0), ..., leaf(k-1)] (k a power of two, `leaf(i)` a pytree shaped as `like`)
    without stacking them: each subtree is a scan over its two halves, adding each half's sum to a
    carry that starts at -0.0, the identity of IEEE addition (-0.0 + x == x for every x, +0.0 and
    NaN included), so the association is the tree's (same bits) while at most log2(k) + 1 partial sums
    are alive (the scans' carries) instead of k stacked values, and `leaf` is traced once. A gradient
    of at least PAIRED_BYTES adds its lowest level as unrolled pairs, `leaf(2j) + leaf(2j + 1)` (`leaf`
    traced twice): no carry to fill and no add of -0.0 there, k / 2 of the k - 1 extra passes (the
    same association, so the same bits; a small model keeps the single trace: half the compile)."""
    paired = sum(s.size * s.dtype.itemsize for s in jax.tree.leaves(like)) >= PAIRED_BYTES

    def subtree(start, size):
        if size == 1:
            return leaf(start)
        half = size // 2
        if size == 2 and paired:
            return jax.tree.map(jnp.add, leaf(start), leaf(start + 1))

        def body(acc, h):
            return jax.tree.map(jnp.add, acc, subtree(start + h * half, half)), None
        init = jax.tree.map(lambda s: jnp.full(s.shape, -0.0, s.dtype), like)
        acc, _ = lax.scan(body, init, jnp.arange(2, dtype=jnp.int32))
        return acc
    return subtree(jnp.int32(0), k)


def finish(total, shards: int, accum: int):
    """The global mean from the tree's sum: / S (exact), then / A."""
    total = jax.tree.map(lambda a: a / shards, total)
    total = total if accum == 1 else jax.tree.map(lambda a: a / accum, total)
    return fence(total)  # its roundings its own: not merged with the clip's or the update's


def combine(partial, axis: str):
    """Every device: the tree over the devices' partial sums (device order), for any pytree."""
    gathered = jax.tree.map(lambda a: lax.all_gather(a, axis), partial)
    return tree(gathered)


def piece_bounds(length: int, row_bytes: int) -> list[tuple[int, int]]:
    """[start, stop) columns of up to PIECES pieces of an [N, length] exchange, none under
    MIN_PIECE_BYTES (`row_bytes`: the bytes of one column, N elements)."""
    pieces = max(1, min(PIECES, length * row_bytes // MIN_PIECE_BYTES))
    edges = [length * i // pieces for i in range(pieces + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def combine_scatter(flat, axis: str, exchange=None):
    """This device's chunk of the tree over the devices' flat partial sums (flat.size % N == 0): device
    i sends chunk j to device j (an all-to-all, or `exchange`), then each adds its N chunks by the tree.
    Exchanged in up to PIECES pieces of columns, one after the other (each piece's input is fenced
    behind the previous piece's sum), so that one piece's [N, L / PIECES] is received at a time
    instead of a whole [N, L]: the same elements, the same tree, the same bytes."""
    n = lax.axis_size(axis)
    chunks = flat.reshape(n, -1)
    parts = []
    for start, stop in piece_bounds(chunks.shape[1], n * chunks.dtype.itemsize):
        source = chunks if not parts else lax.optimization_barrier((chunks, parts[-1]))[0]
        piece = source[:, start:stop]
        received = exchange(piece) if exchange else lax.all_to_all(piece, axis, 0, 0)
        parts.append(tree(received))
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts)


def all_reduce(flat, axis: str, gather=None, exchange=None):
    """The tree over the devices' flat partial sums, on every device: `combine_scatter` then an
    all-gather (`gather`, default lax.all_gather): the bytes of a reduce-scatter plus an all-gather."""
    n = lax.axis_size(axis)
    padded = flat if flat.size % n == 0 else jnp.pad(flat, (0, -flat.size % n))  # a copy: pack padded instead
    chunk = combine_scatter(padded, axis, exchange)
    full = gather(chunk) if gather else lax.all_gather(chunk, axis, tiled=True)
    return full if full.size == flat.size else full[:flat.size]


def leaf_squares(block_rows, axis: str | None):
    """One parameter's sum of squares from the blocks this device holds ([k, L], k = BLOCKS / N):
    `pairsum` per block, the device's subtree, then (axis given) the tree across devices."""
    partial = tree(pairsum(jnp.square(block_rows)))
    return partial if axis is None else tree(lax.all_gather(partial, axis))


def global_norm(grads, axis: str | None = None, sharded: bool = False):
    """The canonical L2 norm. `sharded`: each leaf is this device's [BLOCKS / N x L] flat shard of the
    parameter padded to a multiple of BLOCKS; else each leaf is the full parameter (every block here)."""
    total = None
    for g in jax.tree.leaves(grads):
        rows = g.reshape(BLOCKS // lax.axis_size(axis), -1) if sharded else blocks(g.reshape(-1))
        sq = leaf_squares(rows, axis if sharded else None)
        total = sq if total is None else total + sq
    return jnp.sqrt(total)


def clip(grads, max_norm: float, axis: str | None = None, sharded: bool = False):
    """torch.nn.utils.clip_grad_norm_'s rule on the canonical norm: coef = min(1, max / (norm + 1e-6))."""
    if not max_norm:
        return grads
    from ..optim import TORCH_CLIP_EPS

    grads = fence(grads)  # the scaling below not merged with what made the gradient or what uses it
    coef = jnp.minimum(max_norm / (global_norm(grads, axis, sharded) + TORCH_CLIP_EPS), 1.0)
    return fence(jax.tree.map(lambda g: g * coef.astype(g.dtype), grads))


def all_reduce_tree(values, axis: str, gather=None, exchange=None):
    """`all_reduce` of a pytree (on one device, the values themselves: the tree of one partial sum is it, and
    the exchange would only copy them): each leaf of at least ALONE_BYTES whose size N divides on its own
    (packing it would copy it: a gradient-sized temporary); the other leaves packed into one vector
    per dtype (one exchange each), zero-padded to a multiple of N as it is packed (padding it
    afterwards would copy the whole vector once more). Every element meets the same tree either way."""
    from ..collectives import pack, unpack

    n = lax.axis_size(axis)
    if n == 1:
        return values
    leaves, treedef = jax.tree.flatten(values)
    out = list(leaves)
    alone = [i for i, a in enumerate(leaves) if a.size * a.dtype.itemsize >= ALONE_BYTES and a.size % n == 0]
    for i in alone:
        out[i] = all_reduce(leaves[i].reshape(-1), axis, gather, exchange).reshape(leaves[i].shape)
    rest = [i for i in range(len(leaves)) if i not in alone]
    for dtype in dict.fromkeys(leaves[i].dtype for i in rest):
        index = [i for i in rest if leaves[i].dtype == dtype]
        group = [leaves[i] for i in index]
        size = sum(a.size for a in group)
        reduced = unpack(all_reduce(pack(group, size + -size % n), axis, gather, exchange), group)
        for i, a in zip(index, reduced, strict=True):
            out[i] = a
    return jax.tree.unflatten(treedef, out)


def ppermute_exchange(chunks, axis: str):
    """`lax.all_to_all(chunks, axis, 0, 0)` as N-1 collective-permutes (device i sends its chunk
    i+s to device i+s in round s): ddp-ring's exchange, each device sending (N-1)/N of the vector."""
    n = lax.axis_size(axis)
    me = lax.axis_index(axis)
    received = lax.dynamic_update_slice_in_dim(jnp.zeros_like(chunks), lax.dynamic_slice_in_dim(chunks, me, 1), me, 0)
    for s in range(1, n):
        send = lax.dynamic_slice_in_dim(chunks, (me + s) % n, 1)
        got = lax.ppermute(send, axis, [(i, (i + s) % n) for i in range(n)])
        received = lax.dynamic_update_slice_in_dim(received, got, (me - s) % n, 0)
    return received
