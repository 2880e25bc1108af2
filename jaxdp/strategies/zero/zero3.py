"""`zero3` (alias `fsdp`): ZeRO stage 3, parameters sharded too; FSDP by units (`fsdp.py`): each unit of
the model (an MLP layer, a transformer block, the embeddings, the head) is all-gathered just before its
forward and freed after it, gathered again just before its backward (not with
reshard_after_forward=False), and its gradient reduce-scattered as backward produces it; no device ever
holds full parameters between steps, nor (accum 1) more than two units' full parameters and gradients
during one. Asserted on the compiled program (tests/jaxdp/strategies/zero/test_zero3_compiled.py). Under accumulation,
FSDP's no_sync: gathers for every micro-batch, the full local gradients reduce-scattered once after the
loop. The update is `zero2`'s, on shards that stay shards (`step.py`; the layout: `layout.ZERO3`). Under
`reduction="canonical"` with several shards a device, each parameter is gathered once for the step instead
(`canonical_grads`).
"""
from __future__ import annotations

import jax

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
    """`grads` under reduction="canonical": `zero2`'s canonical reduce-scatter and clip. With one shard a
    device (S = N), on shard values computed unit by unit, each unit gathered forward and backward; with
    several, each parameter gathered once for the step and held through the device's shards (as torch_ref's
    zero3 does), then `zero2`'s program: unit by unit the gathers would repeat for every shard (2x native's
    bytes at S = 2N). The same per-shard program either way, so the same bits."""
    by_unit = sharded_grads_of(canonical.shard_values_of(problem, gather_leaf(comm), opts.reshard_after_forward),
                               comm, n, opts)
    held = sharded_grads_of(canonical.shard_values_of(problem), comm, n, opts)
    gather = gather_leaf(comm)

    def grads_of(param_shards, x, y):
        if canonical.step.step_shards(x, opts.shards, opts.accum, n) == n:
            return by_unit(param_shards, x, y)
        return held(jax.tree.map(gather, param_shards, shapes), x, y)
    return grads_of


make = make_strategy(ZERO3, grads, canonical_grads)
