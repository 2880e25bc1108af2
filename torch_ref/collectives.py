"""Ring collectives written with point-to-point `isend`/`irecv`, the torch twins of
`jaxdp/collectives.py` (same chunking, same rounds).

A flat vector is zero-padded to a multiple of N and cut into N chunks; rank i sends to rank i+1
(mod N) and receives from rank i-1, one chunk per round:
- `ring_reduce_scatter`: N-1 rounds; rank i ends with chunk i summed over all ranks.
  Each rank sends (N-1)/N of the vector's bytes.
- `ring_all_gather`: N-1 rounds; every rank ends with every rank's chunk.
  Each rank sends (N-1)/N of the gathered vector's bytes.
- `ring_all_reduce`: reduce-scatter then all-gather, 2(N-1) rounds and 2(N-1)/N of the bytes.
And the built-ins on flat vectors, as zero2 and the canonical reduction call them: `reduce_scatter`,
`all_gather` (on gloo a reduce-scatter is an all-reduce plus a local chunk: twice the bytes).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def reduce_scatter(flat: torch.Tensor) -> torch.Tensor:
    """Sum `flat` (length a multiple of N) over the ranks; return this rank's shard."""
    shard = flat.new_empty(flat.numel() // dist.get_world_size())
    _reduce_scatter(shard, flat)
    return shard


def all_gather(shard: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Every rank's shard, concatenated in rank order (into `out` where given: N * shard.numel(), flat)."""
    flat = shard.new_empty(shard.numel() * dist.get_world_size()) if out is None else out
    _all_gather(flat, shard)
    return flat


def _exchange(send: torch.Tensor, group=None) -> torch.Tensor:
    """Send `send` to the right-hand neighbour and return what the left-hand neighbour sent."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    right, left = (rank + 1) % n, (rank - 1) % n
    if group is not None:
        right, left = dist.get_global_rank(group, right), dist.get_global_rank(group, left)
    received = torch.empty_like(send)
    ops = [dist.isend(send.contiguous(), right, group=group), dist.irecv(received, left, group=group)]
    for op in ops:
        op.wait()
    return received


def pad_to_multiple(x: torch.Tensor, n: int) -> torch.Tensor:
    """Flatten `x` and zero-pad it to a multiple of n elements."""
    flat = x.reshape(-1)
    return torch.nn.functional.pad(flat, (0, -flat.numel() % n))


def ring_reduce_scatter(x: torch.Tensor, group=None) -> torch.Tensor:
    """Sum flat `x` over the ranks; rank i returns chunk i (ceil(x.numel() / N) elements).

    Round s (0..N-2): rank i sends its partial sum of chunk (i-s-1) mod N to rank i+1, which adds
    its own copy of that chunk. After N-1 rounds rank i holds chunk i, fully summed.
    Matches `dist.reduce_scatter_tensor` on `pad_to_multiple(x, N)`.
    """
    n, me = dist.get_world_size(group), dist.get_rank(group)
    chunks = pad_to_multiple(x, n).reshape(n, -1)
    acc = chunks[(me - 1) % n].clone()
    for s in range(n - 1):
        acc = _exchange(acc, group) + chunks[(me - s - 2) % n]
    return acc


def ring_all_gather(chunk: torch.Tensor, group=None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Concatenate every rank's `chunk` in rank order (flat, N * chunk.numel() elements; into `out` where given).

    Round s (0..N-2): rank i forwards the chunk it received last (its own in round 0) to i+1 and
    stores the one it receives, which came from rank (i-s-1) mod N.
    """
    n, me = dist.get_world_size(group), dist.get_rank(group)
    chunk = chunk.reshape(-1)
    out = chunk.new_empty(n, chunk.numel()) if out is None else out.view(n, chunk.numel())
    out[me] = chunk
    for s in range(n - 1):
        chunk = _exchange(chunk, group)
        out[(me - s - 1) % n] = chunk
    return out.reshape(-1)


def ring_all_reduce(x: torch.Tensor, group=None) -> torch.Tensor:
    """Sum `x` (any shape) over the ranks: ring reduce-scatter, then ring all-gather. Matches
    `dist.all_reduce(x, op=SUM)` up to the order of the additions."""
    summed = ring_all_gather(ring_reduce_scatter(x, group), group)
    return summed[:x.numel()].reshape(x.shape)


def reduce_to_root(x: torch.Tensor) -> torch.Tensor | None:
    """Sum `x` onto rank 0 by a binomial tree, in place: in the round with stride k, rank i (i = k mod
    2k) sends its partial sum to rank i-k, which adds it on the right (`x += received`). With N a
    power of two this is the tree over rank order of `canonical.reduce.tree` (left + right, adjacent
    pairs, level by level), holding one received buffer instead of N gathered ones. Rank 0 gets the
    sum; a rank that has sent returns None."""
    rank, n = dist.get_rank(), dist.get_world_size()
    received, stride = None, 1
    while stride < n:
        if rank % (2 * stride) == stride:
            dist.send(x, rank - stride)
            return None
        if rank + stride < n:
            received = torch.empty_like(x) if received is None else received
            dist.recv(received, rank + stride)
            x += received
        stride *= 2
    return x
