"""`reduction="canonical"`: the same bits on any number of devices dividing the shards
(docs/CANONICAL.md), in four rooms: `compiler.py` the compiler options, `reduce.py` the definition (the shard
program's fence, the tree, the canonical all-reduce and clip), `batchnorm.py` canonical sync BatchNorm, `step.py`
the step every strategy shares (the per-shard program, the folds, the strategy's sync). The public names are
re-exported here: `from jaxdp import canonical; canonical.tree(...)`.
"""
from __future__ import annotations

from ..core.run.reduction import (
    BLOCKS,
    MIN_SHARD_ROWS,
    MIN_SHARD_TOKENS,
    REDUCTIONS,
    default_shards,
    resolve_shards,
    row_tokens,
)
from . import batchnorm, compiler, reduce, step
from .compiler import COMPILER_OPTIONS, UNSIMPLIFIED, compiler_options
from .reduce import (
    all_reduce,
    all_reduce_tree,
    blocks,
    clip,
    combine,
    combine_scatter,
    finish,
    global_norm,
    leaf_squares,
    pairsum,
    ppermute_exchange,
    shard_values,
    streamed_tree,
    tree,
)
from .step import (
    bn_shard_values,
    local_partials,
    shard_values_of,
    step_values,
    streamed_partials,
    unit_value_and_grad,
)

__all__ = ["BLOCKS", "COMPILER_OPTIONS", "MIN_SHARD_ROWS", "MIN_SHARD_TOKENS", "REDUCTIONS", "UNSIMPLIFIED",
           "all_reduce", "all_reduce_tree", "batchnorm", "blocks", "bn_shard_values", "clip", "combine",
           "combine_scatter", "compiler", "compiler_options",
           "default_shards", "finish", "global_norm", "leaf_squares", "local_partials", "pairsum",
           "ppermute_exchange", "reduce", "resolve_shards", "row_tokens", "shard_values", "shard_values_of", "step",
           "step_values", "streamed_partials", "streamed_tree", "tree", "unit_value_and_grad"]
