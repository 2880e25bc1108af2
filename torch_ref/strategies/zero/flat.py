"""zero2's flat layout: every parameter concatenated into ONE flat vector, zero-padded once to a multiple of
N, rank i owning the i-th contiguous shard of S = numel / N elements (`layout.ZERO2`). The torch twin of
`jaxdp/strategies/zero/flat.py`, whose layout pads and shards each parameter on its own (the row's `why`).

The padding is zero in the parameters and in the gradients, so it stays zero through any element-wise
optimizer and adds nothing to norms; it is cut off (`unpad`) whenever full tensors are rebuilt.
"""
from __future__ import annotations

import torch

from ..common import flatten


def padded_flat(tensors, multiple: int) -> torch.Tensor:
    """The tensors as one flat vector, zero-padded to a multiple of `multiple`."""
    flat = flatten(tensors)
    return torch.nn.functional.pad(flat, (0, -flat.numel() % multiple))


def my_shard(flat: torch.Tensor, n: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s shard of a flat vector padded to a multiple of n: elements [rank S, (rank+1) S)."""
    s = flat.numel() // n
    return flat[rank * s:(rank + 1) * s]


def unpad(flat: torch.Tensor, like) -> list[torch.Tensor]:
    """The gathered flat vector -> one tensor per parameter of `like`, each shaped as it (the padding cut)."""
    out, offset = [], 0
    for p in like:
        out.append(flat[offset:offset + p.numel()].view_as(p).clone())
        offset += p.numel()
    return out
