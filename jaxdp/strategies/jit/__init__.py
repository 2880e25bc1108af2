"""`ddp-jit`, `zero1-jit`, `fsdp-jit`: the strategies written as most JAX users write them, plain `jax.jit`
over `NamedSharding`s (the partitioner inserts the collectives), on a mesh of `AxisType.Auto` or
`AxisType.Explicit` (`axis_type=`). One file each; `layout.py` their layouts, `step.py` the shared step."""
from __future__ import annotations

from ...core.run.config import AXIS_TYPES, JIT_STRATEGIES
from . import ddp, fsdp, layout, zero1

FACTORIES = {"ddp-jit": ddp.make, "zero1-jit": zero1.make, "fsdp-jit": fsdp.make}
LAYOUTS = layout.LAYOUTS
assert tuple(FACTORIES) == JIT_STRATEGIES == tuple(LAYOUTS)

__all__ = ["AXIS_TYPES", "FACTORIES", "LAYOUTS"]
