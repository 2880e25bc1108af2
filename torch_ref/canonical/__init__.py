"""`reduction="canonical"` in torch_ref: a step's bits do not depend on the number of ranks (docs/CANONICAL.md).
The twin of `jaxdp/canonical/`, laid out the same way:

- `folds.py`: this rank's subtree over its shards, added as they finish (a binary counter);
- `reduce.py`: the definition (the shard loop's folds, the fixed tree over shards, its reduce-scatter and
  all-reduce across ranks, the canonical clip);
- `batchnorm.py`: canonical BatchNorm statistics (sync), the forward's statistics by the same tree;
- `step.py`: the step every strategy shares (`Canonical`), each strategy's part a `Parts` value.

`from torch_ref import canonical as C; C.tree(...)` reads the definition's names from here.
"""
from __future__ import annotations

from .reduce import (
    BLOCKS,
    REDUCTIONS,
    CanonicalError,
    Folds,
    UnitReduce,
    all_reduce,
    all_to_all,
    clip_coef,
    default_shards,
    finish,
    finish_,
    grad_of,
    leaf_sq,
    one_thread,
    p2p_all_to_all,
    pairsum,
    reduce_loss,
    resolve_shards,
    row_tokens,
    scalar,
    set_grads,
    shard_grads,
    shards_of,
    tree,
    tree_scatter,
)

__all__ = ["BLOCKS", "REDUCTIONS", "CanonicalError", "Folds", "UnitReduce", "all_reduce", "all_to_all", "clip_coef",
           "default_shards", "finish", "finish_", "grad_of", "leaf_sq", "one_thread", "p2p_all_to_all", "pairsum",
           "reduce_loss", "resolve_shards", "row_tokens", "scalar", "set_grads", "shard_grads", "shards_of", "tree",
           "tree_scatter"]
