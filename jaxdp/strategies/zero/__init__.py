"""`zero1`, `zero2`, `zero3` (alias `fsdp`): ZeRO's three stages, sharding what DDP replicates, one small
module each over one declared table of layouts.

- `layout.py`: the table, one row per stage: what it shards (parameters, gradients, optimizer state),
  the specs that follow, and the torch twin's layout with the reason it differs;
- `flat.py`: the flat padded per-parameter shards, the collectives on them (`--collectives xla` uses
  lax.psum / psum_scatter / all_gather, `ring` the explicit ring of `jaxdp.collectives`; both give
  the same trace), the sharded `init` and the optimizer's step on the global flat arrays;
- `step.py`: the step's skeleton (local gradients -> the stage's sync -> the update -> the gather);
- `zero1.py`, `zero2.py`, `zero3.py`: each stage's gradient sync, native and canonical.

Accumulation syncs once: the micro-batches' local gradients are summed on each device, then reduced
(zero3: FSDP's no_sync). Gradients are divided by N before the reduction, as in `ddp`. A
transformation whose update depends on the parameters' shapes (matrix orthogonalisation, masks by
rank) cannot run on the flat layout: `jaxdp.optax_check.check_elementwise` probes for it and names it.
"""
from __future__ import annotations

from . import flat, layout, zero1, zero2, zero3
from .flat import (
    Collectives,
    apply_global_update,
    host_shards,
    host_unshard,
    init_sharded,
    my_shard,
    shard_size,
    unpad,
)
from .layout import LAYOUTS, Layout

STAGES = {1: zero1.make, 2: zero2.make, 3: zero3.make}


def make_stage(stage: int):
    """The strategy factory of ZeRO stage `stage` (1, 2 or 3)."""
    return STAGES[stage]


make_zero1, make_zero2, make_zero3 = zero1.make, zero2.make, zero3.make  # the registry's factory paths


__all__ = ["LAYOUTS", "STAGES", "Collectives", "Layout", "apply_global_update", "flat", "host_shards",
           "host_unshard", "init_sharded", "layout", "make_stage", "make_zero1", "make_zero2", "make_zero3", "my_shard",
           "shard_size", "unpad", "zero1", "zero2", "zero3"]
