"""What every torch strategy shares: the strategy value, local gradients with accumulation, and
small helpers. A strategy wraps the model and its optimizer (as torchtitan's `apply_ddp` /
`apply_fsdp` do) and returns a `Strategy`, the torch twin of `jaxdp.strategies.common.Strategy`.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist

from .. import optim
from ..models import loss_fn


class Strategy(NamedTuple):
    """- `step(x, y)`: one optimizer step on this rank's rows of the global batch; returns metrics:
      `loss` (the mean over the global batch; on rank 0 at least) and, when built with
      return_grads=True, `grads` ({torch name: full averaged gradient, before clipping}; on rank 0 at least);
    - `full_params()`: {torch name: full tensor}. A collective for sharded strategies: call it on
      every rank.
    - `checkpoint`: what `torch_ref.checkpoint` saves and loads, a DCP Stateful (`state_dict()`,
      `load_state_dict(sd)`): the model and this rank's optimizer, keyed by parameter name.
    """
    name: str
    step: Callable
    full_params: Callable
    wrapped: object = None  # the wrapped model or optimizer, for inspection (tests, reports)
    checkpoint: object = None


def micro_batches(x, y, accum: int):
    """`accum` contiguous equal micro-batches of this rank's rows (unequal ones are an error)."""
    if x.shape[0] % accum:
        raise ValueError(f"{x.shape[0]} rows do not split into {accum} equal micro-batches")
    return zip(x.chunk(accum), y.chunk(accum), strict=False)


def local_grads(model, x, y, cfg, no_sync: Callable = contextlib.nullcontext) -> torch.Tensor:
    """Forward and backward over `cfg.accum` micro-batches, accumulating into `.grad`; returns the
    local mean loss (detached).

    Each micro-batch loss is scaled by 1/accum before backward, so the accumulated gradient is the
    mean over this rank's rows. Every micro-batch but the last runs under `no_sync()`, so the
    strategy communicates once per step, after the last backward.
    """
    total = None
    for i, (xm, ym) in enumerate(micro_batches(x, y, cfg.accum)):
        with no_sync() if i < cfg.accum - 1 else contextlib.nullcontext():
            loss = loss_fn(model, xm, ym, cfg.dtype) / cfg.accum
            loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    return total


def mean_over_ranks(t: torch.Tensor, group=None) -> torch.Tensor:
    """All-reduce mean (gloo has no ReduceOp.AVG: sum, then divide by N)."""
    t = t.clone()
    dist.all_reduce(t, group=group)
    return t / dist.get_world_size(group)


def grads_of(model) -> dict[str, torch.Tensor]:
    """A copy of every parameter's `.grad`, by torch name (for the trace)."""
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def params_of(model) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in model.named_parameters()}


def metrics(loss, grads=None) -> dict:
    return {"loss": loss} if grads is None else {"loss": loss, "grads": grads}


def apply_update(model, optimizer, clip_norm: float) -> None:
    """After the sync: the optimizer's update from the averaged `.grad`s, clipping included (as
    torch.nn.utils.clip_grad_norm_), then the gradients cleared. The twin of
    jaxdp.strategies.common.apply_update, whose optax chain clips."""
    optim.clip_(model.parameters(), clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def flatten(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten_into(flat: torch.Tensor, tensors) -> None:
    """Copy consecutive slices of `flat` into `tensors` (in place)."""
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
