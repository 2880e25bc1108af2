"""Models in Flax NNX and the pure functions the strategies train.

A strategy never sees an NNX object: it gets a `Problem`: `params`, a nested dict of arrays (the NNX
state as a pure dict), and `loss_fn(params, x, y)`, the mean loss over the batch it is given (the
built-in models: softmax cross-entropy). `from_module` and `from_loss` build one for any model.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ..core.recorder import unflatten
from ..core.registry import models as registry
from . import cast_once, units
from .cnn import CNN
from .gpt import GPT
from .gpt2 import GPT2
from .llama import Llama
from .mlp import MLP

MASTER_DTYPE = {"float64": jnp.float64, "float32": jnp.float32, "bfloat16": jnp.float32}
COMPUTE_DTYPE = {"float64": jnp.float64, "float32": jnp.float32, "bfloat16": jnp.bfloat16}


def build(cfg, dataset) -> nnx.Module:
    """The NNX model for `cfg`, initialised from `cfg.seed` (the source of both frameworks' init)."""
    registry.entry(cfg.model)  # a model the registry does not hold: one line naming --model and the known ones
    kw = dict(param_dtype=MASTER_DTYPE[cfg.dtype], dtype=COMPUTE_DTYPE[cfg.dtype], rngs=nnx.Rngs(cfg.seed))
    if cfg.model == "mlp":
        return MLP((dataset.n_features, *cfg.hidden, dataset.n_classes), **kw)
    if cfg.model == "gpt":
        return GPT(vocab=dataset.n_classes, seq_len=cfg.seq_len, n_layer=cfg.n_layer, n_head=cfg.n_head,
                   d_model=cfg.d_model, kernels=cfg.kernels, **kw)
    if cfg.model == "cnn":
        return CNN(cfg.channels, dataset.n_classes, batchnorm=cfg.batchnorm, conv_bias=cfg.conv_bias, **kw)
    if cfg.model == "gpt2":
        return GPT2(vocab=dataset.n_classes, seq_len=cfg.seq_len, n_layer=cfg.n_layer, n_head=cfg.n_head,
                    d_model=cfg.d_model, kernels=cfg.kernels, **kw)
    if cfg.model == "llama":
        return Llama(vocab=dataset.n_classes, seq_len=cfg.seq_len, n_layer=cfg.n_layer, n_head=cfg.n_head,
                     n_kv_head=cfg.kv_heads(), d_model=cfg.d_model, d_ff=cfg.ffn_width(), kernels=cfg.kernels, **kw)
    raise AssertionError(f"registered model {cfg.model!r} has no branch here")


class Problem(NamedTuple):
    """What a strategy trains: a pure loss, its parameters, and their names in definition order."""
    loss_fn: Callable       # (params, x, y) -> mean loss over the rows of x
    params: dict            # nested dict (any pytree) of arrays; for NNX, the Flax layout
    order: tuple[str, ...]  # parameter names in the order the model defines them (forward order)
    apply: Callable | None  # (params, x) -> outputs (None for a plain loss function)
    units: tuple = ()       # FSDP units in forward order (`units.Unit`), for zero3
    head: Callable | None = None  # (last unit's output, y) -> loss; None: the units take (x, y), give the loss
    state: dict | None = None  # non-trainable variables (NNX `BatchStat`: running statistics), a pure dict
    update_state: Callable | None = None  # (params, state, x) -> state after one training forward on x


def definition_order(node, prefix=()):
    """Parameter names in the order the modules define them (torch's `parameters()` order), which
    bucketed all-reduce reverses to follow backward. (NNX's own flattening sorts names instead.)"""
    if isinstance(node, nnx.Param):
        yield "/".join(map(str, prefix))
    elif isinstance(node, (nnx.List, list, tuple)):
        for i, child in enumerate(node):
            yield from definition_order(child, prefix + (i,))
    elif isinstance(node, nnx.Module):
        for key, child in vars(node).items():
            yield from definition_order(child, prefix + (key,))


def init(cfg, dataset) -> Problem:
    """The model of `cfg` as a pure loss over a nested dict of parameters, and those parameters."""
    return problem_of(build(cfg, dataset), cfg)


def fused_dtype(cfg):
    """The dtype `cfg`'s weights are cast to once per step (--kernels fused in bf16: cast_once.py), or None."""
    narrower = COMPUTE_DTYPE[cfg.dtype] != MASTER_DTYPE[cfg.dtype]
    return COMPUTE_DTYPE[cfg.dtype] if cfg.kernels == "fused" and narrower else None


def problem_of(model: nnx.Module, cfg) -> Problem:
    """`model` (built by `build(cfg, ...)`, or its shapes) as the Problem `cfg`'s run trains, as
    `jaxdp.parallelize(model, loss=cross_entropy, kernels=cfg.kernels, compute_dtype=fused_dtype(cfg))` has it."""
    problem = from_module(model, cross_entropy)
    dtype = fused_dtype(cfg)
    return cast_once.problem(problem, dtype) if dtype is not None else problem


def from_module(model: nnx.Module, loss: Callable) -> Problem:
    """An NNX module and `loss(outputs, y)` as a Problem. Its parameters (`nnx.Param`) are trained;
    its `nnx.BatchStat` variables (running statistics) are the Problem's `state`, which the loss
    does not read (a training-mode forward normalises with the batch's statistics) and
    `update_state` advances (jaxdp/strategies/stats.py); any other variable is held at its current
    value. zero3's units are the model's `unit_specs()` when it has them, else the whole loss is one unit."""
    graphdef, state, stats, rest = nnx.split(model, nnx.Param, nnx.BatchStat, ...)
    params, stats = nnx.to_pure_dict(state), nnx.to_pure_dict(stats)

    def apply(params, x):  # its statistics' update is dropped: fresh variables in this trace
        return nnx.merge(graphdef, params, stats, rest)(x)

    def update_state(params, state, x):
        module = nnx.merge(graphdef, params, state, rest)
        module(x)  # a training forward updates the statistics in place
        return nnx.to_pure_dict(nnx.state(module, nnx.BatchStat))

    with_state = dict(state=stats, update_state=update_state) if jax.tree.leaves(stats) else {}

    def loss_fn(params, x, y):
        return loss(apply(params, x), y)

    order = tuple(definition_order(model))
    if sorted(order) != sorted(flat_names(params)):  # parameters outside modules/lists: pytree order
        order = tuple(flat_names(params))
    if not hasattr(model, "unit_specs"):
        return Problem(loss_fn, params, order, apply, (units.whole(loss_fn),), None, **with_state)
    pure = units.pure_units(model)
    units.check_paths(pure, params, type(model).__name__)
    paths = list(dict.fromkeys(p for unit in pure for p in unit.paths))  # a tied one: listed by several units
    owned = flat_names([units.at(params, p) for p in paths])
    if len(owned) != len(order):
        raise ValueError(f"{type(model).__name__}.unit_specs() must own every parameter exactly once; "
                         f"owned {len(owned)} of {len(order)}: fix the specs' paths")
    return Problem(loss_fn, params, order, apply, pure, loss, **with_state)


def from_loss(loss_fn: Callable, params) -> Problem:
    """A pure `loss_fn(params, x, y)` and its parameters as a Problem: one zero3 unit, the whole loss."""
    return Problem(loss_fn, params, tuple(flat_names(params)), None, (units.whole(loss_fn),), None)


def cross_entropy(logits, y):
    """Mean softmax cross-entropy of `logits` against integer labels `y`."""
    loss_dtype = jnp.promote_types(logits.dtype, jnp.float32)  # bf16 logits: loss in fp32
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits.astype(loss_dtype), y))


def flat_names(tree) -> dict[str, object]:
    """{'layers/0/kernel': leaf, ...}: the Flax path joined with '/', as the trace names parameters."""
    out = {}
    for path, leaf in jax.tree.flatten_with_path(tree)[0]:
        out["/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)] = leaf
    return out


unflatten_names = unflatten  # the inverse of `flat_names` (jaxdp/core/recorder.py: JAX-free)


def initial_arrays(cfg, dataset) -> dict[str, np.ndarray]:
    """`cfg`'s initial parameters (and BatchNorm's statistics) as Flax-named NumPy arrays, created on JAX's
    CPU device as `jaxdp.train` does: the one source of the initial bits for both frameworks (the torch
    side loads them, `torch_ref.models.load_flax`)."""
    if cfg.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    with jax.default_device(jax.devices("cpu")[0]):
        problem = init(cfg, dataset)
    flat = {**flat_names(problem.params), **flat_names(problem.state or {})}  # + BatchNorm's
    return {k: np.array(v) for k, v in flat.items()}
