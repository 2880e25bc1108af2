"""The non-finite check of every strategy's step (`--nan-check`, on by default): inside the compiled step, one
fused reduction over the gradient the update used and the updated parameters gives a small boolean array
`finite` of shape (2, tensors): row 0 per gradient tensor, row 1 per parameter tensor, True where every element
is finite. It goes out with the loss; the host reads it with the loss (one scalar sync already) and, only when
one is False, names the step and the tensor (`nonfinite_names`) and stops the run before the step is recorded or
checkpointed (jaxdp/train.py). The update itself has been applied to the state in memory; it is never saved.

Where the arrays are ZeRO's flat shards (zero1/2/3, hsdp) each device reduces its own part (`shard_flags`: no
collective is added to the step) and the host reduces the parts; where they are the -jit forms' global arrays
the reduction spans the shards and XLA adds the cross-device step; where they are replicated inside a
shard_map (ddp, ddp-bucket, ddp-ring, ddp-pmap, single) every device holds the same synced gradient and
parameters, so its own flags are everyone's; dp's gradient is true on device 0 only, whose flags it broadcasts.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P


def flags(grads, params) -> jax.Array:
    """(2, tensors) bool: every element of each gradient tensor, and of each parameter tensor, finite."""
    rows = [[jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(tree)] for tree in (grads, params)]
    return jnp.stack([jnp.stack(row) for row in rows])


def shard_flags(grads, params, shards: int) -> jax.Array:
    """(2, tensors, shards) bool for ZeRO's flat layout (every array 1-d, split in `shards` equal parts over the
    devices): each device's part reduced where it lies, so that the step adds no collective (the exact bytes of
    docs/STRATEGIES.md stay exact); the host reduces the last axis. A 0-d leaf (replicated) is broadcast."""
    def part(a):
        ok = jnp.isfinite(a)
        return jnp.all(ok.reshape(shards, -1), axis=1) if a.ndim else jnp.broadcast_to(ok, (shards,))
    return jnp.stack([jnp.stack([part(a) for a in jax.tree.leaves(tree)]) for tree in (grads, params)])


def spec_flags(grads, params, grad_specs, param_specs):
    """([per gradient], [per parameter]) bool arrays for arrays laid out by PartitionSpecs (the -jit forms): each
    reduced over every dimension but its sharded one, which stays split over the devices (one entry per row of
    that dimension), so that the step adds no collective; the host reduces each (`flag_specs`: their layout)."""
    def one(a, spec):
        d, ok = _split_dim(spec), jnp.isfinite(a)
        return jnp.all(ok) if d is None else jnp.all(ok, axis=tuple(i for i in range(a.ndim) if i != d))
    return tuple([one(a, s) for a, s in zip(jax.tree.leaves(tree), _specs(specs), strict=True)]
                 for tree, specs in ((grads, grad_specs), (params, param_specs)))


def flag_specs(grad_specs, param_specs):
    """The PartitionSpecs of `spec_flags`' arrays."""
    return tuple([P() if _split_dim(s) is None else P(s[_split_dim(s)]) for s in _specs(specs)]
                 for specs in (grad_specs, param_specs))


def _specs(tree) -> list:
    return jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, P))


def _split_dim(spec):
    return next((i for i, s in enumerate(spec) if s is not None), None)


def with_flags(metrics: dict, grads, params, check: bool) -> dict:
    """`metrics` with `finite` added (when `check`)."""
    return {**metrics, "finite": flags(grads, params)} if check else metrics


def nonfinite_names(finite, params) -> list[str]:
    """The host side, read only when a flag is False: 'gradient NAME' / 'parameter NAME' for each tensor whose
    flag is False (names: the parameters' paths joined with '/', as in the trace)."""
    if isinstance(finite, tuple):  # the -jit forms: one array per tensor
        finite = np.array([[np.all(a) for a in row] for row in finite])
    finite = np.asarray(finite)
    finite = finite.reshape(*finite.shape[:2], -1).all(axis=2)  # ZeRO's per-shard flags: all shards
    paths = ["/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
             for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    return [f"{what} {paths[i]}" for row, what in enumerate(("gradient", "parameter"))
            for i in np.flatnonzero(~finite[row])]
