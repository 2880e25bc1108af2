"""`reduction="canonical"` (`--reduction canonical`): a step's bits do not depend on the number of ranks.

The definition (issue 16, the same as jaxdp's): each micro-batch is cut into S shards of r rows; each
shard's mean loss and gradient come from its own forward and backward (`autograd.grad` over that shard
alone); the S shard gradients are summed by one fixed binary tree over shard index (adjacent pairs,
level by level): rank d holds shards [d S/N, (d+1) S/N) and sums its subtree locally, the N partial
sums are combined by the same tree across ranks. Then /S, a left fold over micro-batches, /A. The loss
for the log goes the same way. Clipping uses a canonical norm: each parameter's squares in row-major
order, zero-padded to a power of two and summed by halving, then a left fold over parameters.

Across ranks the tree runs as a canonical reduce-scatter: an all-to-all sends chunk c of every rank's
partial sums to rank c (reduce-scatter's bytes), which sums its N rows by the tree; an all-gather
completes an all-reduce (all-reduce's bytes). Everything after is element-wise, and runs with one
intra-op thread (`one_thread`: a GEMM's blocking and an element-wise kernel's split may depend on the
thread count, and every world must run the same kernels).
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

from jaxdp.config import ConfigError

from .collectives import ring_all_gather
from .strategies.common import flatten, micro_batches
from .strategies.zero2 import all_gather

REDUCTIONS = ("native", "canonical")
MAX_SHARDS, MIN_ROWS = 64, 4


class CanonicalError(ConfigError):
    """A canonical-reduction setting that cannot run; the message names the fix."""


def default_shards(rows: int) -> int:
    """S for a micro-batch of `rows` rows: the largest power of two dividing it that keeps shards of at
    least 4 rows, at most 64 (fewer than 8 rows: 1)."""
    s = 1
    while 2 * s <= MAX_SHARDS and rows % (2 * s) == 0 and rows // (2 * s) >= MIN_ROWS:
        s *= 2
    return s


def check_shards(shards: int, world: int, rows: int) -> int:
    """S for a micro-batch of `rows` global rows on `world` ranks (None: the default), checked."""
    s = default_shards(rows) if shards in (None, 0) else shards
    if not isinstance(s, int) or isinstance(s, bool) or s < 1 or s & (s - 1):
        raise CanonicalError(f"shards must be a power of two (1, 2, 4, ...), got {shards!r}; pass e.g. shards=4")
    if s % world:
        raise CanonicalError(f"canonical reduction needs the {world} ranks to divide shards={s}; pass shards= a "
                             f"multiple of {world} (--shards), or run on a number of ranks dividing {s}")
    if rows % s:
        raise CanonicalError(f"a micro-batch of {rows} rows does not split into shards={s} equal shards; pass a "
                             f"batch whose rows per micro-batch divide by {s}, or another --shards")
    return s


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


class Tree:
    """The same tree, fed one leaf at a time (a binary counter: O(log S) partial sums held)."""

    def __init__(self):
        self.stack: list[tuple[int, torch.Tensor]] = []

    def push(self, leaf: torch.Tensor) -> None:
        level = 0
        while self.stack and self.stack[-1][0] == level:
            leaf = self.stack.pop()[1] + leaf
            level += 1
        self.stack.append((level, leaf))

    def result(self) -> torch.Tensor:
        assert len(self.stack) == 1, "the leaves pushed are not a power of two"
        return self.stack.pop()[1]


def finish(summed: torch.Tensor, shards: int) -> torch.Tensor:
    """[A, ...] tree sums -> the step's value: /S, a left fold over micro-batches, /A."""
    means = summed / shards
    total = means[0]
    for m in means[1:]:
        total = total + m
    return total / summed.shape[0]


def tree_scatter(partials: torch.Tensor, exchange=None) -> torch.Tensor:
    """[A, L] (L a multiple of N) -> [A, L/N]: this rank's chunk, summed over the ranks by the tree.
    One all-to-all: each rank sends (N-1)/N of its partial sums, reduce-scatter's bytes."""
    n = dist.get_world_size() if dist.is_initialized() else 1
    if n == 1:
        return partials
    accum, length = partials.shape
    send = partials.reshape(accum, n, length // n).transpose(0, 1).contiguous()  # row d goes to rank d
    return tree((exchange or all_to_all)(send))


def all_to_all(send: torch.Tensor) -> torch.Tensor:
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send)
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


def gather_chunks(chunk: torch.Tensor, ring: bool = False) -> torch.Tensor:
    """[A, c] on every rank -> [A, N c] (chunks in rank order): the all-gather half of an all-reduce."""
    n = dist.get_world_size() if dist.is_initialized() else 1
    if n == 1:
        return chunk
    flat = (ring_all_gather if ring else all_gather)(chunk.reshape(-1).contiguous())
    return flat.reshape(n, *chunk.shape).transpose(0, 1).reshape(chunk.shape[0], -1)


def all_reduce(partials: torch.Tensor, ring: bool = False) -> torch.Tensor:
    """[A, L] partial sums -> [A, L] summed over the ranks by the tree (all-reduce's bytes)."""
    n = dist.get_world_size() if dist.is_initialized() else 1
    pad = -partials.shape[1] % n
    padded = torch.nn.functional.pad(partials, (0, pad))
    summed = gather_chunks(tree_scatter(padded, p2p_all_to_all if ring else None), ring)
    return summed[:, :partials.shape[1]]


def leaf_sq(g: torch.Tensor) -> torch.Tensor:
    """Sum of squares of `g` in row-major order, zero-padded to a power of two, summed by halving."""
    x = g.reshape(-1).square()
    x = torch.nn.functional.pad(x, (0, (1 << max(x.numel() - 1, 0).bit_length()) - x.numel()))
    while x.numel() > 1:
        half = x.numel() // 2
        x = x[:half] + x[half:]
    return x[0]


def clip_coef(grads, max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_'s factor min(1, max_norm / (norm + 1e-6)), with the canonical norm
    of the full gradients `grads` (in parameter order)."""
    total = None
    for g in grads:
        total = leaf_sq(g) if total is None else total + leaf_sq(g)
    return torch.clamp(max_norm / (total.sqrt() + 1e-6), max=1.0)


def shard_grads(module, params, x, y, loss_fn, accum: int, local: int):
    """This rank's tree sums: ([A, P] gradients, [A] losses), each shard's from its own backward."""
    grads, losses = [], []
    for xm, ym in micro_batches(x, y, accum):
        g_tree, l_tree = Tree(), Tree()
        for xs, ys in zip(xm.chunk(local), ym.chunk(local), strict=True):
            loss = scalar(loss_fn(module(xs), ys))
            g_tree.push(flat_grad(loss, params))
            l_tree.push(loss.detach())
        grads.append(g_tree.result())
        losses.append(l_tree.result())
    return torch.stack(grads), torch.stack(losses)


def flat_grad(loss: torch.Tensor, params) -> torch.Tensor:
    """d loss / d params, flat in parameter order, by `autograd.grad` (no `.grad`, no strategy hook)."""
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return flatten([torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)])


def scalar(loss) -> torch.Tensor:
    if not torch.is_tensor(loss) or loss.numel() != 1:
        shape = tuple(loss.shape) if torch.is_tensor(loss) else type(loss).__name__
        raise ConfigError(f"loss_fn returned {shape}, not a scalar tensor; return the mean loss of the rows, "
                          f"e.g. torch.nn.functional.cross_entropy(outputs, y)")
    return loss.reshape(())


def reduce_loss(losses: torch.Tensor, shards: int) -> torch.Tensor:
    """[A] local loss tree sums -> the global loss, the same on every rank (an all-gather of A scalars)."""
    n = dist.get_world_size() if dist.is_initialized() else 1
    if n > 1:
        losses = tree(all_gather(losses.contiguous()).reshape(n, -1))
    return finish(losses, shards)


def set_grads(params, flat: torch.Tensor) -> None:
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
        offset += p.numel()


class UnitReduce(ReduceScatter):
    """zero3: FSDP2's reduce-scatter of one unit, replaced. Every shard's backward hands over the unit's
    unsharded gradient (rank-major, as reduce-scatter takes it) and nothing is sent; after the step's
    last backward the tree runs: this rank's subtree per micro-batch, then `tree_scatter`, then `finish`,
    written into FSDP's output (N = 1: FSDP calls no comm, the hook reads its output)."""

    def __init__(self, local: int, accum: int, shards: int):
        self.local, self.accum, self.shards = local, accum, shards
        self.input, self.tree, self.done = None, Tree(), []
        self.count = 0

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group=None, op=None, async_op=False):
        self.input = input_tensor
        return None

    def hook(self, reduce_output: torch.Tensor) -> None:
        self.tree.push(self.input if self.input is not None else reduce_output.clone())
        self.input, self.count = None, self.count + 1
        if self.count % self.local == 0:
            self.done.append(self.tree.result())
        if len(self.done) == self.accum:
            partials, self.done, self.count = torch.stack(self.done), [], 0
            reduce_output.copy_(finish(tree_scatter(partials), self.shards))
