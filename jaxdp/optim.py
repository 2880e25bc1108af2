"""optax optimizers with torch.optim semantics, so the torch reference can match them exactly.

The chain is the order torch applies things in a training step:
  1. `clip_grad_norm(max_norm)`: torch.nn.utils.clip_grad_norm_, coef = max_norm / (norm + 1e-6)
     clamped at 1 and always multiplied in (optax.clip_by_global_norm has no 1e-6 and so differs);
  2. coupled weight decay for sgd/momentum/adam (torch adds weight_decay * p to the gradient inside
     `step`, after the user clipped);
  3. the update rule: SGD, SGD(momentum=0.9, dampening=0, nesterov=False), Adam, or AdamW with
     decoupled decay (p <- p - lr * (adam + wd * p), which is torch's p * (1 - lr wd) - lr * adam).
Adam hyperparameters are torch's defaults: betas (0.9, 0.999), eps 1e-8.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

TORCH_CLIP_EPS = 1e-6
MOMENTUM = 0.9


def global_norm(grads, axis_name=None) -> jax.Array:
    """The L2 norm of the whole gradient. When each device holds a disjoint shard (ZeRO), pass the
    mesh axis: the shards' sums of squares are psum'd, so the norm is the whole gradient's, never a
    shard's (zero padding adds nothing)."""
    sum_of_squares = sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads))
    if axis_name is not None:
        sum_of_squares = jax.lax.psum(sum_of_squares, axis_name)
    return jnp.sqrt(sum_of_squares)


def clip_grad_norm(max_norm: float, axis_name=None) -> optax.GradientTransformation:
    """torch.nn.utils.clip_grad_norm_ as an optax transformation."""

    def init_fn(params):
        return optax.EmptyState()

    def update_fn(updates, state, params=None):
        norm = global_norm(updates, axis_name)
        coef = jnp.minimum(max_norm / (norm + TORCH_CLIP_EPS), 1.0)
        return jax.tree.map(lambda g: g * coef.astype(g.dtype), updates), state

    return optax.GradientTransformation(init_fn, update_fn)


def make(name: str, lr: float, weight_decay: float = 0.0, clip_norm: float = 0.0,
         axis_name=None) -> optax.GradientTransformation:
    """The optax chain for `--optimizer name`. `axis_name`: the gradient it sees is sharded over
    that mesh axis (ZeRO), so clipping must take the norm over all shards. Every other step of the
    chain is element-wise, so it runs unchanged on a shard."""
    parts = []
    if clip_norm > 0:
        parts.append(clip_grad_norm(clip_norm, axis_name))
    if name == "adamw":
        parts.append(optax.adamw(lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=weight_decay))
        return optax.chain(*parts)
    if weight_decay > 0:
        parts.append(optax.add_decayed_weights(weight_decay))
    if name == "sgd":
        parts.append(optax.sgd(lr))
    elif name == "momentum":
        parts.append(optax.sgd(lr, momentum=MOMENTUM))
    elif name == "adam":
        parts.append(optax.adam(lr, b1=0.9, b2=0.999, eps=1e-8))
    else:
        raise ValueError(f"unknown optimizer {name!r}; valid: sgd, momentum, adam, adamw")
    return optax.chain(*parts)


SHARDED_GRADIENT_STRATEGIES = ("zero1", "zero2", "zero3")


def for_config(cfg) -> optax.GradientTransformation:
    """The optimizer of a run: sharded over the `data` axis for the ZeRO strategies."""
    from .devices import AXIS

    axis = AXIS if cfg.strategy in SHARDED_GRADIENT_STRATEGIES else None
    return make(cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.clip_norm, axis_name=axis)
