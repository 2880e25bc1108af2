"""ZeRO's layouts, declared once: a table with one row per stage saying what it shards (parameters,
gradients, optimizer state), from which the stages' specs, the memory formula, the communication theory,
`full_params` and a checkpoint's resharding are read (never from a test of the stage's number or name).

JAX's layout is the same for every sharded part of every stage: each parameter flattened and
zero-padded to a multiple of N, device i holding the i-th contiguous shard of S = ceil(size / N)
elements (`flat.py`). The torch twin shards as torch's own tools do, so each row also says the twin's
layout and why the two differ; the bits of the update are the same, the bytes each device holds
differ by the padding and the partition (docs/STRATEGIES.md, "ZeRO's layouts, declared once").
"""
from __future__ import annotations

from typing import NamedTuple

from jax.sharding import PartitionSpec as P

from ...core.registry import strategies as registry
from ...devices import AXIS

JAX_LAYOUT = "per-parameter flat shards, each parameter padded to a multiple of N"


class Layout(NamedTuple):
    """What one stage shards over `data` (True: each device holds 1/N of it, hsdp 1/S; False: a full copy)."""
    stage: int
    shards_params: bool
    shards_grads: bool
    shards_opt_state: bool
    torch: str   # the torch twin's layout
    why: str     # why the twin's layout differs from JAX's
    jax: str = JAX_LAYOUT

    @property
    def param_spec(self):
        """How the train state's parameters enter the step's shard_map."""
        return P(AXIS) if self.shards_params else P()

    @property
    def grad_spec(self):
        """How the synchronised gradient leaves the shard_map (the trace's gradient): full or a shard."""
        return P(AXIS) if self.shards_grads else P()

    @property
    def gathers_after_update(self) -> bool:
        """The updated parameter shards are all-gathered into full parameters after the update."""
        return self.shards_opt_state and not self.shards_params

    @property
    def sharded(self) -> dict:
        """{part: sharded?} for the memory formula's three parts."""
        return {"params": self.shards_params, "grads": self.shards_grads, "opt_state": self.shards_opt_state}


REPLICATED = Layout(0, False, False, False, torch="a full copy on every rank", why="the same layout",
                    jax="a full copy on every device")
ZERO1 = Layout(1, False, False, True,
               torch="ZeroRedundancyOptimizer: whole parameters partitioned greedily over ranks (none split)",
               why="ZeroRedundancyOptimizer, torch's stock ZeRO-1, never splits a parameter (its state is only "
                   "roughly 1/N); JAX shards each parameter as for zero2/3: 1/N up to the padding")
ZERO2 = Layout(2, False, True, True,
               torch="one flat vector of all parameters, padded once to a multiple of N, reduce-scattered",
               why="torch_ref packs every gradient into one bucket, one reduce-scatter; JAX keeps the parameters' "
                   "tree (one flat array each), so a user's optax chain and a checkpoint see it leaf by leaf")
ZERO3 = Layout(3, True, True, True,
               torch="FSDP2 (`fully_shard`): dim-0 DTensor shards of each parameter, per unit",
               why="FSDP2 splits dim 0 (rows padded on the last ranks); JAX splits the flattened parameter: "
                   "one layout for every stage, contiguous for any shape")
HSDP = Layout(3, True, True, True,
              jax="per-parameter flat shards over a group's `data` axis, each parameter padded to a multiple of S, "
                  "the same in every group",
              torch="FSDP2 (`fully_shard`) on a 2-D mesh (replicate, shard): dim-0 DTensor shards of each parameter "
                    "within a group of S ranks, the same shards in each of the R groups",
              why="as zero3's, with S in place of N: FSDP2 splits dim 0 within the group; JAX splits the flattened "
                  "parameter over the grid's `data` axis, replicated over `replica`")
LAYOUTS = {e.name: globals()[e.layout] for e in registry.ENTRIES if e.comm == "zero"}  # each row named by its entry
PARTS = ("params", "grads", "opt_state")


def of(strategy: str) -> Layout:
    """The layout of a (canonical) strategy name: its ZeRO row, or a full copy everywhere."""
    return LAYOUTS.get(strategy, REPLICATED)
