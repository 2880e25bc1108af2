"""bf16 under `--kernels fused`: the parameters cast to the compute dtype once per step, at the top of the
loss (and of each zero3 unit, after its gather), as JAX users write mixed precision, instead of flax's cast
inside every layer call (`dtype=`). The master parameters, their gradients (the cast's transpose brings each
back to fp32), the reduction and the optimizer stay fp32. A weight used twice (a tied head) is cast once and
its two uses' gradients meet in bf16 before the cast back, as FSDP2's `MixedPrecisionPolicy` has them
(torch_ref's twin: `cast_once` in torch_ref/kernels.py).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def cast(tree, dtype):
    """Every floating leaf of `tree` as `dtype`; integer leaves (and a narrower float) as they are."""
    def one(leaf):
        kind = getattr(leaf, "dtype", None)
        wider = kind is not None and jnp.issubdtype(kind, jnp.floating) and jnp.finfo(kind).bits > jnp.finfo(dtype).bits
        return leaf.astype(dtype) if wider else leaf
    return jax.tree.map(one, tree)


def problem(prob, dtype):
    """`prob` (a `models.Problem`) computing on its parameters cast to `dtype` once per call of its loss,
    its forward, each unit and its statistics' update."""
    def loss_fn(params, x, y, inner=prob.loss_fn):
        return inner(cast(params, dtype), x, y)

    def apply(params, x, inner=prob.apply):
        return inner(cast(params, dtype), x)

    def update_state(params, state, x, inner=prob.update_state):
        return inner(cast(params, dtype), state, x)

    units = tuple(u._replace(apply=lambda ps, x, inner=u.apply: inner(cast(ps, dtype), x)) for u in prob.units)
    return prob._replace(loss_fn=loss_fn, apply=apply if prob.apply else None, units=units,
                         update_state=update_state if prob.update_state else None)
