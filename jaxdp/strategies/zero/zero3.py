"""`zero3` (alias `fsdp`): ZeRO stage 3, parameters sharded too; FSDP by units (`fsdp.py`): each unit of
the model (an MLP layer, a transformer block, the embeddings, the head) is all-gathered just before its
forward and freed after it, gathered again just before its backward (not with
reshard_after_forward=False), and its gradient reduce-scattered as backward produces it; no device ever
holds full parameters between steps, nor (accum 1) more than two units' full parameters and gradients
during one. Asserted on the compiled program (tests/jaxdp/strategies/zero/test_zero3_compiled.py). Under accumulation,
FSDP's no_sync: gathers for every micro-batch, the full local gradients reduce-scattered once after the
loop. The update is `zero2`'s, on shards that stay shards (`step.py`; the layout: `layout.ZERO3`).
"""
from __future__ import annotations

from ... import canonical
from . import fsdp
from .flat import unpad
from .layout import ZERO3
from .step import make_strategy
from .zero2 import sharded_grads_of


def gather_leaf(comm):
    """`(shard, shape) -> the full parameter`: an all-gather, the padding cut off."""
    return lambda s, shape: unpad(comm.all_gather(s), shape)


def grads(problem, comm, shapes, n, opts):
    """`(param shards, x, y) -> (loss, my gradient shards, the same for the trace)`: unit by unit
    (`fsdp.unit_grads`), each unit's gradient / N reduce-scattered."""
    unit_grads = fsdp.unit_grads(problem, shapes, gather_leaf(comm), lambda g: comm.reduce_scatter(g.reshape(-1) / n),
                                 opts.accum, opts.reshard_after_forward)

    def grads_of(param_shards, x, y):
        loss, shards = unit_grads(param_shards, x, y)
        return loss, shards, shards
    return grads_of


def canonical_grads(problem, comm, shapes, n, opts):
    """`grads` under reduction="canonical": `zero2`'s canonical reduce-scatter and clip, on shard values
    computed unit by unit, each unit gathered forward and backward, nothing reduced inside."""
    shard_values = canonical.shard_values_of(problem, gather_leaf(comm), opts.reshard_after_forward)
    return sharded_grads_of(shard_values, comm, n, opts)


make = make_strategy(ZERO3, grads, canonical_grads)
