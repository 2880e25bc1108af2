"""The -jit strategies' layouts, declared once: which parts of the train state each shards over `data`, and
how one array is sharded (`leaf_spec`), read by the step, the memory formula and the communication theory.

Sharding is the levanter / MaxText way, on the arrays' own dimensions (a `NamedSharding` per array, no
flattening): an array is split along its largest dimension that N divides (the first of equal ones), and
kept whole on every device when no dimension divides (a bias of 10 classes on 4 devices). So "1/N" is
exact for the arrays that divide and the formula adds the others whole: `formula`. ZeRO's hand-written
stages (`strategies/zero/`) flatten and pad every parameter instead; the twin layouts differ accordingly.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ...core.registry import strategies as registry
from ...devices import AXIS

AXIS_TYPE = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}


class Layout(NamedTuple):
    """What one -jit strategy shards over `data`; the rest is a full copy on every device."""
    name: str
    shards_params: bool
    shards_opt_state: bool
    torch: str   # the strategy torch_ref runs under the same name (`torch_ref.strategies.TWINS`)
    twin: str    # ... and what it is
    stage: int   # the ZeRO stage of the layout (its memory formula)

    def sharded(self, axis_type: str = "auto") -> dict:
        """{part: sharded?} for the memory formula's three parts. The gradient is the step's reduced one:
        in the parameters' layout, except under `explicit` where the optimizer state is sharded (zero1-jit
        reduces it straight into the state's shards, stage 2's gradient; the per-device sum it carries
        through the micro-batches is whole, as stage 1's)."""
        grads = self.shards_params or (self.shards_opt_state and axis_type == "explicit")
        return {"params": self.shards_params, "grads": grads, "opt_state": self.shards_opt_state}


def _row(name: str, stage: int) -> Layout:
    """The row of -jit strategy `name` from its registry row (what it shards, its torch twin) and its stage."""
    e = registry.entry(name)
    return Layout(name, e.shards[0], e.shards[2], e.twin, f"torch {e.twin_tool}", stage)


DDP, ZERO1, FSDP = _row("ddp-jit", 0), _row("zero1-jit", 1), _row("fsdp-jit", 3)
LAYOUTS = {row.name: row for row in (DDP, ZERO1, FSDP)}


def leaf_spec(shape, n: int) -> P:
    """How one array of `shape` is sharded over N devices: along its largest dimension that N divides,
    or whole (`P()`) when none does, or N is 1."""
    dims = [d for d in range(len(shape)) if n > 1 and shape[d] % n == 0]
    if not dims:
        return P()
    d = max(dims, key=lambda i: (shape[i], -i))
    return P(*([None] * d), AXIS)


def specs(tree, n: int, sharded: bool):
    """`tree`'s PartitionSpecs: each leaf's `leaf_spec` where `sharded`, else whole everywhere."""
    return jax.tree.map(lambda a: leaf_spec(np.shape(a), n) if sharded else P(), tree)


def shardings(mesh: Mesh, spec_tree):
    return jax.tree.map(lambda s: NamedSharding(mesh, s), spec_tree, is_leaf=lambda s: isinstance(s, P))


def typed_mesh(mesh: Mesh, axis_type: str) -> Mesh:
    """The same devices on one `data` axis of JAX's `AxisType` `axis_type` ('auto' or 'explicit')."""
    return Mesh(mesh.devices, (AXIS,), axis_types=(AXIS_TYPE[axis_type],))


def per_device(shape, n: int, sharded: bool) -> int:
    """Elements of one array of `shape` that one device holds."""
    size = math.prod(shape)
    return size // n if sharded and leaf_spec(shape, n) != P() else size


def formula(layout: Layout, shapes, n: int, param_bytes: int, grad_bytes: int, k_bytes: int,
            replicated_state_bytes: int = 0, axis_type: str = "auto") -> dict:
    """Bytes per device by the ZeRO formula of the layout's stage with this layout's sharding: each part
    sum(size / N) over the arrays that divide plus sum(size) over the others where it is sharded, Psi
    where it is not (ddp-jit: stage 0, zero1-jit: 1, fsdp-jit: 3; the gradient is the step's output,
    `Layout.sharded`)."""
    elements = {part: sum(per_device(s, n, sharded) for s in shapes)
                for part, sharded in layout.sharded(axis_type).items()}
    return {"params": param_bytes * elements["params"], "grads": grad_bytes * elements["grads"],
            "opt_state": k_bytes * elements["opt_state"] + replicated_state_bytes}


def theory(layout: Layout, shapes, n: int, itemsize: int, accum: int, loss_itemsize: int | None = None) -> dict:
    """Bytes each device sends per step by the textbook (ring) algorithms: the least this layout needs,
    whatever `accum` (docs/STRATEGIES.md). The gradient reduced once per step: the arrays that shard
    reduce-scattered ((N-1)/N of each) where the optimizer state is sharded, the others all-reduced
    (2 (N-1)/N); the sharded parameters gathered once per step ((N-1)/N of each): zero1-jit after the
    update, fsdp-jit before the first micro-batch (kept through the others: the memory that gathering
    again per micro-batch, as zero3 does, would save); the loss, one scalar all-reduce. Both axis types
    are measured against it: `explicit` states this program, `auto` is whatever the partitioner chose."""
    ring = 2 * (n - 1) / n
    split = [math.prod(s) for s in shapes if layout.shards_opt_state and leaf_spec(s, n) != P()]
    whole = sum(math.prod(s) for s in shapes) - sum(split)
    out = {"all-reduce": ring * (whole * itemsize + (loss_itemsize or itemsize)),
           "reduce-scatter": (n - 1) / n * sum(split) * itemsize,
           "all-gather": (n - 1) / n * sum(split) * itemsize, "point-to-point": 0.0}
    if n == 1:
        out = {k: 0.0 for k in out}
    out["total"] = sum(out.values())
    return out
