"""`reduction="canonical"` (`--reduction canonical`): a step's bits do not depend on the number of ranks.

The definition (issue 16, jaxdp's: /docs/CANONICAL.md): each micro-batch is cut into S shards of r
rows; each shard's mean loss and gradient come from its own forward and backward (`autograd.grad`
over that shard alone); each shard index folds its micro-batches in order (a left fold: rank d keeps
one accumulator per shard it holds, [d S/N, (d+1) S/N)); the S accumulators are summed by one fixed
binary tree over shard index (adjacent pairs, level by level), its lower levels on the rank and its
upper levels across ranks; then /S (exact) and /A. The loss for the log goes the same way. Clipping
uses the canonical norm (`clip_coef`).

Across ranks the tree runs as a canonical reduce-scatter: an all-to-all sends chunk c of every rank's
partial sum to rank c (reduce-scatter's bytes), which sums its N rows by the tree; an all-gather
completes an all-reduce (all-reduce's bytes). Once per step, whatever the accumulation. Everything
after is element-wise, and the step runs with one intra-op thread (`one_thread`: a GEMM's blocking and
an element-wise kernel's split may depend on the thread count, and every world must run the same
kernels).
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist

from jaxdp.core.run.config import ConfigError
from jaxdp.core.run.reduction import (  # noqa: F401 (one definition of S for both sides)
    BLOCKS,
    default_shards,
    resolve_shards,
    row_tokens,
)

from ..collectives import all_gather, ring_all_gather
from .folds import Folds, Owned, grad_of, scalar, set_grads, shard_grads, shards_of  # noqa: F401 (C.<name>)

REDUCTIONS = ("native", "canonical")


class CanonicalError(ConfigError):
    """A canonical-reduction setting that cannot run; the message names the fix."""


@contextlib.contextmanager
def one_thread():
    """Run with one intra-op thread (the same kernels in every world), then restore the count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def tree(rows: torch.Tensor) -> torch.Tensor:
    """Sum the leading axis (a power of two long) by adjacent pairs, level by level."""
    while rows.shape[0] > 1:
        rows = rows[0::2] + rows[1::2]
    return rows[0]


def finish(total: torch.Tensor, shards: int, accum: int) -> torch.Tensor:
    """The tree's sum -> the global mean: / S (a power of two: exact), then / A."""
    total = total / shards
    return total if accum == 1 else total / accum


def finish_(total: torch.Tensor, shards: int, accum: int) -> torch.Tensor:
    """`finish` in place (the same kernels: the same bits), on a sum this step owns."""
    total.div_(shards)
    return total if accum == 1 else total.div_(accum)


def tree_scatter(flat: torch.Tensor, exchange=None, columns=None, in_place: bool = False) -> torch.Tensor:
    """[L] (L a multiple of N) -> [L/N]: this rank's chunk, summed over the ranks by the tree.
    One all-to-all: each rank sends (N-1)/N of its partial sum, reduce-scatter's bytes. `columns` (hsdp:
    rank d's shard column, for each d): [L] is S chunks and rank d gets chunk columns[d]. `in_place`: the
    tree added within the received [N, L/N] (`tree_`), the chunk its first row, a view: no level beside it,
    and the caller frees it (`release`) when done."""
    n = dist.get_world_size() if dist.is_initialized() else 1
    if n == 1:
        return flat
    rows = flat.reshape(n, -1) if columns is None else flat.reshape(max(columns) + 1, -1)[torch.tensor(columns)]
    received = (exchange or all_to_all)(rows)  # row d goes to rank d
    if in_place:
        return tree_(received)
    total = tree(received)
    if total.untyped_storage().data_ptr() != received.untyped_storage().data_ptr():  # (one row: a view of it)
        release(received)
    return total


def release(t: torch.Tensor) -> None:
    """Free a CPU buffer of this step's own that a finished collective was given, now: gloo's worker thread may
    still hold the tensor for a while after the call returned (measured: 8 MiB kept through the update in one
    step of six, zero1 at N = 4), so dropping our reference alone does not always free it. Not on a GPU (a
    collective may still be reading it on its stream there)."""
    if t.device.type == "cpu":
        t.untyped_storage().resize_(0)


def all_to_all(send: torch.Tensor) -> torch.Tensor:
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send.contiguous())
    return received


def p2p_all_to_all(send: torch.Tensor) -> torch.Tensor:
    """The all-to-all as N-1 isend/irecv pairs (ddp-ring's hand-written collectives)."""
    n, me = dist.get_world_size(), dist.get_rank()
    received = torch.empty_like(send)
    received[me] = send[me]
    ops = [op for s in range(1, n) for op in (dist.isend(send[(me + s) % n].contiguous(), (me + s) % n),
                                             dist.irecv(received[(me - s) % n], (me - s) % n))]
    for op in ops:
        op.wait()
    return received


def all_reduce(flat: torch.Tensor, ring: bool = False) -> torch.Tensor:
    """A flat partial sum -> the tree over the ranks' partial sums, on every rank (all-reduce's bytes:
    `tree_scatter` then an all-gather; `ring`: isend/irecv pairs and the hand-written ring)."""
    n = dist.get_world_size() if dist.is_initialized() else 1
    if n == 1:
        return flat
    send = padded(flat, n)
    chunk = tree_scatter(send, p2p_all_to_all if ring else None)
    if send is not flat:  # our padded copy
        release(send)
    return (ring_all_gather if ring else all_gather)(chunk.contiguous())[:flat.numel()]


def all_reduce_(flat: torch.Tensor, shards: int, accum: int, ring: bool = False) -> torch.Tensor:
    """`finish_(all_reduce(flat))` written over `flat`, a partial sum the step owns, with one gradient-sized
    temporary (the all-to-all's receive buffer, the tree added within it, freed before the all-gather) and this
    rank's chunk: the chunk is finished (element-wise: the same bits as finishing the whole) and gathered into
    `flat` itself, which the all-to-all has sent already. A length N does not divide is zero-padded in `flat`'s
    own storage where `flat` ends it (`grown`: the padding's elements sum to zeros, left there), else padded
    into a copy (`all_reduce`). N = 1: `finish_`."""
    n = dist.get_world_size() if dist.is_initialized() else 1
    if n == 1:
        return finish_(flat, shards, accum)
    whole = flat if flat.numel() % n == 0 else grown(flat, n)
    if whole is None:
        return flat.copy_(finish_(all_reduce(flat, ring), shards, accum))
    total = tree_scatter(whole, p2p_all_to_all if ring else None, in_place=True)
    chunk = finish_(total.clone(), shards, accum)
    release(total)  # the receive buffer, before the all-gather (gloo's holds a vector of its own meanwhile)
    (ring_all_gather if ring else all_gather)(chunk, out=whole)
    return flat


def grown(flat: torch.Tensor, n: int) -> torch.Tensor | None:
    """`flat` zero-padded to a multiple of n within its own storage, grown at its end (the allocator moves it
    once; no second buffer is held beside it), where `flat` is contiguous and ends that storage and the storage
    can grow (torch's own: not NumPy's memory); else None.
    Every tensor on the storage sees the move; `flat`'s elements keep their values."""
    storage, size = flat.untyped_storage(), flat.element_size()
    ends = (flat.storage_offset() + flat.numel()) * size == storage.nbytes()
    if not (flat.is_contiguous() and ends and storage.resizable()):
        return None
    length = flat.numel() + -flat.numel() % n
    storage.resize_((flat.storage_offset() + length) * size)
    whole = flat.new_empty(0).set_(storage, flat.storage_offset(), (length,))
    whole[flat.numel():] = 0
    return whole


def tree_(rows: torch.Tensor) -> torch.Tensor:
    """`tree` over the leading axis, added within `rows` (the caller's own buffer): level by level, rows[i] +=
    rows[i + step] for i a multiple of 2 step, the same pairs in the same order (the same bits); the sum is
    rows[0], a view."""
    step = 1
    while step < rows.shape[0]:
        rows[0::2 * step].add_(rows[step::2 * step])
        step *= 2
    return rows[0]


def padded(flat: torch.Tensor, n: int) -> torch.Tensor:
    """`flat` zero-padded to a multiple of n; itself where n divides it (a pad of nothing is still a copy),
    so only for a value that is then read, never written."""
    return flat if flat.numel() % n == 0 else torch.nn.functional.pad(flat, (0, -flat.numel() % n))


def pairsum(rows: torch.Tensor) -> torch.Tensor:
    """Sum over the last axis: zero-pad it to a power of two, then adjacent pairs until one remains."""
    width = rows.shape[-1]
    rows = torch.nn.functional.pad(rows, (0, (1 << max(width - 1, 0).bit_length()) - width))
    while rows.shape[-1] > 1:
        rows = rows[..., 0::2] + rows[..., 1::2]
    return rows[..., 0]


def leaf_sq(g: torch.Tensor) -> torch.Tensor:
    """One parameter's sum of squares: row-major, zero-padded to a multiple of BLOCKS (64), cut into 64
    blocks, each block by `pairsum`, the 64 block sums by the tree."""
    flat = g.reshape(-1)
    blocks = torch.nn.functional.pad(flat, (0, -flat.numel() % BLOCKS)).reshape(BLOCKS, -1)
    return tree(pairsum(blocks.square()))


def clip_coef(grads, max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_'s factor min(1, max_norm / (norm + 1e-6)), with the canonical norm
    of the full gradients `grads` (in parameter order: a left fold of `leaf_sq`)."""
    total = None
    for g in grads:
        total = leaf_sq(g) if total is None else total + leaf_sq(g)
    return torch.clamp(max_norm / (total.sqrt() + 1e-6), max=1.0)


def reduce_loss(loss: torch.Tensor, shards: int, accum: int) -> torch.Tensor:
    """This rank's loss partial sum -> the global loss, the same on every rank (an all-gather of N floats)."""
    n = dist.get_world_size() if dist.is_initialized() else 1
    if n > 1:
        loss = tree(all_gather(loss.reshape(1)))
    return finish(loss, shards, accum)


class UnitReduce:
    """zero3: FSDP2's reduce-scatter of one unit, replaced (`set_custom_reduce_scatter` calls `allocate`
    and the object; duck-typed, FSDP2's `ReduceScatter` base is private). Every shard's backward hands
    over the unit's unsharded gradient (rank-major, as reduce-scatter takes it: FSDP2 allocates it first,
    then the output) and nothing is sent; after the step's last backward: the folds, this rank's subtree,
    `tree_scatter` (hsdp: over every rank, each getting its shard column's chunk, `columns`), `finish`,
    written into FSDP's output. hsdp: FSDP2's all-reduce across the replicas still runs before the hook
    (FSDP2 has no custom all-reduce, and without it no hook), on the zeroed output; the hook overwrites it."""

    def __init__(self, local: int, accum: int, shards: int, columns=None):
        self.local, self.accum, self.shards, self.columns = local, accum, shards, columns
        self.spare: list = []  # input buffers the folds have summed into another one: handed out again
        self.input, self.folds, self.count, self.allocated = None, Folds(local, accum, self.spare), 0, 0

    def allocate(self, size, *, dtype, device):
        """The input (FSDP2 asks for it first; `chunk_cat` writes every element of it, padding included):
        a spare buffer of the step when one fits, else a new one. The output (second): at a group of one
        on a 1-D mesh FSDP2 copies the input into it, so the input itself (a copy onto itself is none);
        otherwise zeros (under hsdp FSDP2 all-reduces it across the replicas before the hook)."""
        self.allocated += 1
        if self.allocated % 2 == 1:
            self.input = self._recycled(size, dtype, device)
            return self.input
        if self.columns is None and tuple(size) == tuple(self.input.shape):
            return self.input
        return torch.zeros(*size, dtype=dtype, device=device)

    def _recycled(self, size, dtype, device) -> torch.Tensor:
        """A spare of `size` on a CPU (no streams: its last reader, an add in the hook, is done), else new.
        On a GPU the hook runs on FSDP2's reduce stream, so a spare may still be read there: never reused."""
        if torch.device(device).type != "cpu":
            self.spare.clear()  # (not kept alive either)
        numel = math.prod(size)
        for j, t in enumerate(self.spare):
            if t.numel() == numel and t.dtype == dtype:
                return self.spare.pop(j).view(*size)
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group=None, op=None, async_op=False):
        return None

    def hook(self, reduce_output: torch.Tensor) -> None:
        self.folds.add(self.count % self.local, Owned(self.input.view(-1)))  # our buffer: summed into
        self.input, self.count = None, self.count + 1
        if self.count == self.local * self.accum:
            total = tree_scatter(self.folds.partial(), columns=self.columns)
            reduce_output.copy_(finish(total, self.shards, self.accum))
            self.spare.clear()  # nothing is held from one step to the next
            self.folds, self.count = Folds(self.local, self.accum, self.spare), 0
