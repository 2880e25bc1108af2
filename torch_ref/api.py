"""torch_ref as a library: `parallelize` a model of your own for any strategy, then `train_step`.

    import torch, torch_ref
    torch.distributed.init_process_group("gloo")            # or torchrun; none for `single`
    model, optimizer = torch_ref.parallelize(MyModel(), strategy="fsdp",  # zero3
                                             optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3), accum=2)
    for x, y in batches:                                      # this rank's rows of the global batch
        loss = torch_ref.train_step(model, optimizer, x, y, torch.nn.functional.cross_entropy, clip_norm=1.0)

The strategies are the ones `python -m torch_ref train` runs (DDP, FSDP2, ZeroRedundancyOptimizer and
the hand-written ones: `torch_ref/strategies/`), and the CLI runs through these two functions. The
strategy's machinery stays reachable from the returned model (`state_of(model)`), which is how
`train_step` and `torch_ref.trace.Recorder` find it.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from jaxdp.core.registry import strategies as registry
from jaxdp.core.run.config import ConfigError

from . import kernels as kernels_
from . import strategies
from .strategies.common import Strategy, train

_STATE = "_torch_ref_parallel"  # the attribute of the returned model holding its Strategy (a cycle gc frees,
# where a WeakKeyDictionary whose values hold their keys would keep every model alive)


class NotParallelized(ConfigError):
    """A model torch_ref.parallelize did not return, given where one is needed."""


def parallelize(model: torch.nn.Module, *, strategy: str, optimizer: Callable, accum: int = 1,
                reduction: str = "native", shards: int | None = None, kernels: str = "mirrored",
                compute_dtype: torch.dtype | None = None, compile: bool = False,
                **strategy_options) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Wrap `model` (on this rank's device, parameters set) for `strategy` and build its optimizer.

    `optimizer`: a callable from an iterable of parameters to a torch.optim.Optimizer (called on
    what the strategy optimizes: the whole model, zero2's flat shard, FSDP2's DTensors; zero1 calls
    it once more on a throwaway parameter to learn the class and hyperparameters for
    ZeroRedundancyOptimizer). `accum`: micro-batches per step. Options: `bucket_mb` (ddp, zero1,
    ddp-bucket), `reshard_after_forward` and `units` (zero3 and hsdp: submodules, or lists of submodules
    sharded as one group), `replicas` (hsdp: FSDP2 on a (replicate, shard) mesh of R x world / R ranks),
    `hsdp_hosts` (hsdp: "shard", each torchrun host holds whole shard groups, or "replica": whole replica groups).
    `reduction="canonical"` makes the step's bits independent of the number of
    ranks (torch_ref/canonical/reduce.py): `shards` per micro-batch (a power of two the ranks divide; None: the
    default of the global rows per micro-batch). `kernels="fused"`: the models' attention by SDPA and the
    optimizer's fused implementation; `compute_dtype=torch.bfloat16`: bf16 compute over fp32 master parameters
    (mirrored: autocast; fused: the weights cast once per forward, FSDP2's MixedPrecisionPolicy under zero3 and
    hsdp); `compile=True`: torch.compile of each unit's forward (torch_ref/kernels.py, docs/KERNELS.md). Every rank
    calls it, inside an initialised process group (none is
    needed for `single`). Returns (model, optimizer): pass both to `train_step`.
    """
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"parallelize wants a torch.nn.Module, got {type(model).__name__}; pass your model")
    if hasattr(model, _STATE):
        raise ConfigError("this model was already parallelized; parallelize a fresh model, or keep using the "
                          "(model, optimizer) that parallelize returned")
    name = strategies.resolve(strategy)
    if not isinstance(accum, int) or isinstance(accum, bool) or accum < 1:
        raise ConfigError(f"accum must be a positive int (micro-batches per step), got {accum!r}")
    if not callable(optimizer):
        raise ConfigError(f"optimizer must be a callable from parameters to a torch.optim.Optimizer, got "
                          f"{type(optimizer).__name__}; pass e.g. lambda params: torch.optim.SGD(params, lr=0.1)")
    if not registry.on_one_device(name) and not dist.is_initialized():
        raise ConfigError(f"strategy {name!r} needs an initialised process group: call "
                          f"torch.distributed.init_process_group(...) first (or start under torchrun), or use "
                          f"strategy={registry.ONE_DEVICE!r}")
    if reduction not in ("native", "canonical") or (shards is not None and reduction != "canonical"):
        raise ConfigError(f"reduction must be 'native' or 'canonical' (shards= only with 'canonical'), got "
                          f"reduction={reduction!r}, shards={shards!r}; pass reduction='canonical', shards=S")
    kernels_.check(kernels, compute_dtype, compile, reduction)
    optimizer, policy = kernels_.prepare(model, name, _checked(optimizer), kernels, compute_dtype, compile)
    par = strategies.build(name, model, optimizer, accum, reduction, shards, mp_policy=policy, **strategy_options)
    setattr(par.model, _STATE, par)
    return par.model, par.optimizer


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               loss_fn: Callable, *, clip_norm: float = 0.0) -> float:
    """One optimizer step; returns the mean loss over the global batch (the same float on every rank).

    `x, y`: this rank's rows of the global batch, all micro-batches (contiguous chunks of
    rows/accum each); `loss_fn(outputs, y)` -> the mean loss of those rows as a scalar tensor (e.g.
    torch.nn.functional.cross_entropy; the step's gradient is the mean over all rows of the step).
    The strategy communicates once per step, after the last micro-batch. `clip_norm` > 0 clips the
    averaged gradient by its global norm as torch.nn.utils.clip_grad_norm_ does (under ZeRO the
    whole gradient's norm, never a shard's).
    """
    par = state_of(model)
    if optimizer is not par.optimizer:
        raise ConfigError("optimizer is not the one parallelize returned with this model; pass that optimizer")
    if len(x) != len(y):
        raise ConfigError(f"x has {len(x)} rows but y has {len(y)}; pass this rank's rows of both")
    return train(par, x, y, loss_fn, float(clip_norm))


def state_of(model) -> Strategy:
    """The strategy machinery behind a model `parallelize` returned (its hooks, optimizer, checkpoint)."""
    par = getattr(model, _STATE, None) if isinstance(model, torch.nn.Module) else None
    if par is None:
        raise NotParallelized(f"{type(model).__name__} was not returned by torch_ref.parallelize; call "
                              f"model, optimizer = torch_ref.parallelize(model, strategy=..., optimizer=...) and "
                              f"pass that model")
    return par


def _checked(optimizer: Callable) -> Callable:
    def build(params):
        built = optimizer(params)
        if not isinstance(built, torch.optim.Optimizer):
            raise ConfigError(f"the optimizer callable returned {type(built).__name__}, not a torch.optim.Optimizer; "
                              f"return one, e.g. lambda params: torch.optim.SGD(params, lr=0.1)")
        return built

    return build
