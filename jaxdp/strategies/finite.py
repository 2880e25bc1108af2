"""The non-finite check of every strategy's step (`--nan-check`, on by default): inside the compiled step, one
fused reduction over the gradient the update used and the updated parameters gives a small boolean array
`finite` of shape (2, tensors): row 0 per gradient tensor, row 1 per parameter tensor, True where every element
is finite. It goes out with the loss; the host reads it with the loss (one scalar sync already) and, only when
one is False, names the step and the tensor (`nonfinite_names`) and stops the run before the step is recorded or
checkpointed (jaxdp/train.py). The update itself has been applied to the state in memory; it is never saved.

Where the arrays are global (zero1/2/3, hsdp, the -jit forms: the optimizer runs outside any shard_map) the
reduction is over the whole sharded array and XLA adds the cross-device step; where they are replicated inside a
shard_map (ddp, ddp-bucket, ddp-ring, ddp-pmap, single) every device holds the same synced gradient and
parameters, so its own flags are everyone's; dp's gradient is true on device 0 only, whose flags it broadcasts.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def flags(grads, params) -> jax.Array:
    """(2, tensors) bool: every element of each gradient tensor, and of each parameter tensor, finite."""
    rows = [[jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(tree)] for tree in (grads, params)]
    return jnp.stack([jnp.stack(row) for row in rows])


def with_flags(metrics: dict, grads, params, check: bool) -> dict:
    """`metrics` with `finite` added (when `check`)."""
    return {**metrics, "finite": flags(grads, params)} if check else metrics


def nonfinite_names(finite, params) -> list[str]:
    """The host side, read only when a flag is False: 'gradient NAME' / 'parameter NAME' for each tensor whose
    flag is False (names: the parameters' paths joined with '/', as in the trace)."""
    finite = np.asarray(finite)
    paths = ["/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
             for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    return [f"{what} {paths[i]}" for row, what in enumerate(("gradient", "parameter"))
            for i in np.flatnonzero(~finite[row])]
