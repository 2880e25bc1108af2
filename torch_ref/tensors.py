"""The tensor plumbing under both the strategies and canonical: a rank's rows as micro-batches (checked
alike on every rank), and the flat view of a list of tensors. It sits below both, so that canonical
(torch_ref/canonical/) takes nothing from a strategy's file, as in jaxdp."""
from __future__ import annotations

import torch
import torch.distributed as dist

from jaxdp.core.run.config import ConfigError


def check_rows(rows: int, accum: int, device) -> None:
    """On the first step, every rank: the same number of rows, a multiple of accum. Unequal rows
    would make the mean of the ranks' means a wrong gradient (or, where one rank refuses its rows,
    leave the others waiting in a collective): every rank sees every count and raises the same
    error. One small all-gather, once per parallelized model."""
    counts = [rows]
    if dist.is_initialized() and dist.get_world_size() > 1:
        gathered = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, torch.tensor([rows], dtype=torch.int64, device=device))
        counts = [int(c) for c in gathered]
    if len(set(counts)) > 1 or counts[0] % accum or counts[0] == 0:
        world = len(counts)
        raise ConfigError(f"the ranks got {counts} rows; give every rank the same multiple of accum={accum} rows "
                          f"(a global batch divisible by ranks x accum = {world} x {accum} = {world * accum})")


def micro_batches(x, y, accum: int):
    """`accum` contiguous equal micro-batches of this rank's rows (unequal ones are an error)."""
    if x.shape[0] % accum or x.shape[0] == 0:
        raise ConfigError(f"this rank's {x.shape[0]} rows do not split into {accum} equal micro-batches; "
                          f"give each rank a multiple of accum={accum} rows")
    return zip(x.chunk(accum), y.chunk(accum), strict=True)


def flatten(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten_into(flat: torch.Tensor, tensors) -> None:
    """Copy consecutive slices of `flat` into `tensors` (in place)."""
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
