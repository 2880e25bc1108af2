"""What every torch strategy shares: `Strategy` (the state `torch_ref.parallelize` keeps for a
wrapped model, read with `api.state_of`), the one training step every strategy runs (`train`), local
gradients with accumulation, the one `no_sync`, and small helpers. A strategy wraps the model and
builds its optimizer (as torchtitan's `apply_ddp` / `apply_fsdp` do) and returns a `Strategy`, the
torch twin of `jaxdp.strategies.common.Strategy`; the strategies differ only in their hooks
(`no_sync`, `sync`, `reduce_loss`, `full_grads`, `update`, `full_params`) and, under
`reduction="canonical"`, in the `canonical_parts` they declare (torch_ref/canonical/step.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist

from jaxdp.core.run.config import ConfigError

from .. import optim
from ..checkpoint import ModelOptimizer
from ..tensors import check_rows, flatten, micro_batches, unflatten_into  # noqa: F401 (the strategies import them here)


class StrategyOptions(NamedTuple):
    """What a strategy is built with besides the model and the optimizer factory."""
    accum: int = 1
    bucket_mb: float = 25.0  # ddp, zero1 (DDP's bucket_cap_mb), ddp-bucket
    reshard_after_forward: bool = True  # zero3 (FSDP2's name)
    units: list | None = None  # zero3: the submodules (or lists of them) sharded one by one
    replicas: int = 1  # hsdp: R groups of N / R ranks (zero3 within a group, replicated across)
    hsdp_hosts: str = "shard"  # hsdp: a host holds whole shard groups ("shard") or whole replica groups
    reduction: str = "native"  # "canonical": the same bits on any N (torch_ref/canonical/step.py)
    shards: int | None = None  # canonical: shards per micro-batch (None: the default)
    mp_policy: object = None  # zero3, hsdp: FSDP2's MixedPrecisionPolicy (fused bf16: torch_ref/kernels.py)
    inner_steps: int = 4  # diloco: K local steps between outer steps
    outer_lr: float = 0.7  # diloco: the outer SGD's learning rate
    outer_momentum: float = 0.9  # diloco: the outer SGD's Nesterov momentum (0: plain SGD)


def _nothing() -> None:
    return None


@contextlib.contextmanager
def no_sync(set_sync: Callable[[bool], None]):
    """Gradient sync off inside the block, on again after it (`set_sync(False)`, then `set_sync(True)`):
    the one `no_sync` of the hand-written wrappers and FSDP2 (DDP's own is torch's)."""
    set_sync(False)
    try:
        yield
    finally:
        set_sync(True)


@dataclasses.dataclass(eq=False)
class Strategy:
    """A model wrapped for one strategy (jaxdp's `Strategy` is the same idea as plain functions).
    `model` and `optimizer` are what `parallelize` returns (the DDP / FSDP2 / hand-written wrapper
    and the optimizer the user's factory built);
    `module` is the user's unwrapped model. The hooks, in the order `train` calls them:
    - `no_sync()`: a context manager around every micro-batch's backward but the last;
    - `sync()`: after the last backward, make the gradients the mean over all ranks' rows;
    - `reduce_loss(loss)`: the local mean loss -> the global mean (a tensor);
    - `full_grads()`: {torch name: the full averaged gradient}, a collective under sharding
      (only called while a Recorder is attached: `return_grads`);
    - `update(clip_norm)`: clip (torch's clip_grad_norm_ semantics), step, clear the gradients;
    - `full_params()`: {torch name: full tensor}, a collective under sharding: every rank calls it.
    `checkpoint` is the DCP Stateful `torch_ref.checkpoint` saves: the model and this rank's optimizer.
    `canonical_parts` is what the strategy declares for `reduction="canonical"` (a `canonical.step.Parts`).
    """
    name: str
    model: torch.nn.Module
    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    accum: int
    update: Callable
    full_params: Callable
    full_grads: Callable
    checkpoint: object
    no_sync: Callable = contextlib.nullcontext
    sync: Callable = _nothing
    reduce_loss: Callable = None
    wrapped: object = None  # the wrapper or sharded optimizer, for inspection (tests, reports)
    return_grads: bool = False  # a Recorder is attached: keep each step's averaged gradient (jaxdp's name)
    grads: dict | None = None  # the last step's, when kept
    rows_checked: bool = False  # the first step checked that every rank got the same rows
    canonical_parts: object = None  # the strategy's part of the canonical step (canonical.step.Parts)
    canonical: object = None  # reduction='canonical': its step (canonical.step.Canonical) replaces train's
    replicas_agree: bool = True  # every rank holds the same parameters after every step (diloco: after outer steps)

    def __post_init__(self):
        if self.reduce_loss is None:
            self.reduce_loss = mean_over_ranks


def make_strategy(name, model, module, optimizer, accum, **hooks) -> Strategy:
    """A `Strategy` with the default hooks for those not given: `update` clips, steps and clears
    (`apply_update`), parameters and gradients are read from `module` (a DTensor's full value is
    the strategy's to gather), the checkpoint is `ModelOptimizer(module, optimizer)`."""
    hooks.setdefault("update", lambda clip_norm: apply_update(module.parameters(), optimizer, clip_norm))
    hooks.setdefault("full_params", lambda: params_of(module))
    hooks.setdefault("full_grads", lambda: grads_of(module))
    hooks.setdefault("checkpoint", ModelOptimizer(module, optimizer))
    return Strategy(name, model, module, optimizer, accum, **hooks)


def train(par: Strategy, x, y, loss_fn: Callable, clip_norm: float) -> float:
    """One optimizer step on this rank's rows `x, y` (all micro-batches): local gradients, the
    strategy's sync (once), the global mean loss, the kept gradient (before clipping), the update."""
    if par.canonical is not None:
        return par.canonical.train(x, y, loss_fn, clip_norm)
    if not par.rows_checked:
        check_rows(len(x), par.accum, next(par.module.parameters()).device)
        par.rows_checked = True
    loss = local_grads(par.model, x, y, loss_fn, par.accum, par.no_sync)
    par.sync()
    loss = par.reduce_loss(loss)
    par.grads = par.full_grads() if par.return_grads else None
    par.update(clip_norm)
    return float(loss)




def local_grads(model, x, y, loss_fn: Callable, accum: int, no_sync: Callable = contextlib.nullcontext):
    """Forward and backward over `accum` micro-batches, accumulating into `.grad`; returns the
    local mean loss (detached).

    Each micro-batch loss (`loss_fn(model(x), y)`, a mean) is scaled by 1/accum before backward, so
    the accumulated gradient is the mean over this rank's rows. Every micro-batch but the last runs
    under `no_sync()`, so the strategy communicates once per step, after the last backward.
    """
    total = None
    for i, (xm, ym) in enumerate(micro_batches(x, y, accum)):
        with no_sync() if i < accum - 1 else contextlib.nullcontext():
            loss = loss_fn(model(xm), ym)
            if not torch.is_tensor(loss) or loss.numel() != 1:
                shape = tuple(loss.shape) if torch.is_tensor(loss) else type(loss).__name__
                raise ConfigError(f"loss_fn returned {shape}, not a scalar tensor; return the mean loss of the "
                                  f"rows, e.g. torch.nn.functional.cross_entropy(outputs, y)")
            loss = loss.reshape(()) / accum
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


def apply_update(params, optimizer, clip_norm: float) -> None:
    """After the sync: the optimizer's update from the averaged `.grad`s, clipping included (as
    torch.nn.utils.clip_grad_norm_), then the gradients cleared. The twin of
    jaxdp.strategies.common.apply_update, whose optax chain clips."""
    optim.clip_(params, clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

