"""`zero1`, `zero2`, `zero3` (alias `fsdp`): ZeRO's three stages in torch, one small module each over one
declared table of layouts (the twin of `jaxdp/strategies/zero/`; torch has no `fsdp.py`: FSDP2's
`fully_shard` is zero3).

- `layout.py`: the table, one row per stage: what it shards (parameters, gradients, optimizer state) and
  how torch lays it out, read by the theory, the memory formula and the report;
- `flat.py`: zero2's one flat padded vector and this rank's shard of it (`my_shard`);
- `step.py`: zero2's update on the shard and the gather of the updated shards;
- `zero1.py` (ZeroRedundancyOptimizer over DDP), `zero2.py` (hand-written), `zero3.py` (FSDP2).
"""
from __future__ import annotations

from . import flat, layout, step, zero1, zero2, zero3
from .layout import LAYOUTS, Layout

STAGES = {1: zero1.make, 2: zero2.make, 3: zero3.make}

__all__ = ["LAYOUTS", "STAGES", "Layout", "flat", "layout", "step", "zero1", "zero2", "zero3"]
