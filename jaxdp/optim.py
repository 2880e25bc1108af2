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

from .optax_check import Elementwise

TORCH_CLIP_EPS = 1e-6
MOMENTUM = 0.9


def global_norm(grads) -> jax.Array:
    """The L2 norm of the whole gradient. Under ZeRO the optimizer sees the global flat arrays
    (sharded over `data`), so this is the whole gradient's norm there too: XLA adds the shards' sums
    of squares (the zero padding adds nothing)."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))


def clip_grad_norm(max_norm: float) -> optax.GradientTransformation:
    """torch.nn.utils.clip_grad_norm_ as an optax transformation."""

    def init_fn(params):
        return optax.EmptyState()

    def update_fn(updates, state, params=None):
        norm = global_norm(updates)
        coef = jnp.minimum(max_norm / (norm + TORCH_CLIP_EPS), 1.0)
        return jax.tree.map(lambda g: g * coef.astype(g.dtype), updates), state

    return optax.GradientTransformation(init_fn, update_fn)


def make(name: str, lr: float, weight_decay: float = 0.0, clip_norm: float = 0.0) -> Elementwise:
    """The optax chain for `--optimizer name`: the same under every strategy (ZeRO applies it to
    the global sharded arrays, so clipping sees the whole gradient). Element-wise parts only, so marked
    `Elementwise`: ZeRO's probe of the optimizer (`jaxdp.optax_check`) is skipped for it."""
    parts = []
    if clip_norm > 0:
        parts.append(clip_grad_norm(clip_norm))
    if name == "adamw":
        parts.append(optax.adamw(lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=weight_decay))
        return Elementwise(*optax.chain(*parts))
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
    return Elementwise(*optax.chain(*parts))


def for_config(cfg) -> optax.GradientTransformation:
    """The optimizer of a run (the same chain for every strategy)."""
    return make(cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.clip_norm)
