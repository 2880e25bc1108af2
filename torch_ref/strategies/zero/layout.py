"""torch's ZeRO layouts, declared once: a table with one row per stage saying what it shards (parameters,
gradients, optimizer state), how a sharded part is cut, and how the ranks get full parameters back, from
which the communication theory, the memory formula (`torch_ref/analysis/theory.py`), the report's notes
(`torch_ref/analysis/accounting.py`) and the finite check's reduction are read (never from a test of
the stage's name). The twin of `jaxdp/strategies/zero/layout.py`, whose rows say the same of JAX's layout
and why the two differ (docs/STRATEGIES.md, "ZeRO's layouts, declared once").

How a sharded part is cut (`cut`), each the way torch's own tool for the stage cuts it:
  whole   ZeroRedundancyOptimizer: whole parameters partitioned greedily over the ranks (none split);
  flat    one flat vector of all parameters, padded once to a multiple of N, rank i the i-th shard;
  dim0    FSDP2: each parameter a DTensor sharded along dim 0 (rows padded to a multiple of N).
"""
from __future__ import annotations

import math
from typing import NamedTuple

from jaxdp.core.registry import strategies as registry


class Layout(NamedTuple):
    """What one stage shards over the ranks (True: each rank holds its part; False: a full copy), and how."""
    stage: int
    shards_params: bool
    shards_grads: bool
    shards_opt_state: bool
    cut: str             # how a sharded part is cut: "whole", "flat" or "dim0" (module docstring)
    gather: str          # how full parameters come back: "broadcast" or "all-gather" after the update,
                         # "unit all-gather" before each unit's forward (and backward)
    master_shard: bool   # a master copy of this rank's shard of the parameters (zero2's `main_param`)
    note: str            # what the report must explain about the layout

    @property
    def sharded(self) -> dict:
        """{part: sharded?} for the memory formula's three parts."""
        return {"params": self.shards_params, "grads": self.shards_grads, "opt_state": self.shards_opt_state}

    @property
    def gathers_after_update(self) -> bool:
        """The updated parameters are sent back to every rank after the update (`gather`)."""
        return self.shards_opt_state and not self.shards_params

    def padded(self, shapes: list[tuple], n: int) -> int:
        """The elements each collective of this layout moves: Psi, or Psi padded as the cut pads it."""
        psi = sum(math.prod(s) for s in shapes)
        if self.cut == "flat":
            return n * math.ceil(psi / n)
        if self.cut == "dim0":
            return fsdp_padded(shapes, n)
        return psi

    def norms(self, shapes: list[tuple]) -> int:
        """The values all-reduced to clip by the whole gradient's norm: none when every rank holds it whole,
        one sum of squares for a flat shard, one norm per parameter tensor for DTensors (clip_grad_norm_)."""
        return {"whole": 0, "flat": 1, "dim0": len(shapes)}[self.cut] if self.shards_grads else 0

    def mine(self, shapes: list[tuple], n: int, rank: int) -> tuple[int, int]:
        """(elements, tensors) of a sharded part rank `rank` holds (the tensors count the optimizer's step
        counts: one per parameter tensor it steps)."""
        sizes = [math.prod(s) for s in shapes]
        if self.cut == "whole":
            owned = zero1_partition(sizes, n)[rank]
            return sum(sizes[i] for i in owned), len(owned)
        if self.cut == "flat":
            return math.ceil(sum(sizes) / n), 1
        return sum(dim0_rows(s, n, rank) * math.prod(s[1:]) for s in shapes), len(shapes)


def fsdp_padded(shapes, n: int) -> int:
    """Elements FSDP2 all-gathers for these parameters: each is padded along dim 0 to a multiple of n."""
    return sum(math.ceil(s[0] / n) * n * math.prod(s[1:]) for s in shapes)


def dim0_rows(shape: tuple, n: int, rank: int) -> int:
    """The rows of FSDP2's local shard: [r c, min((r+1) c, dim0)) with c = ceil(dim0 / n)."""
    c = math.ceil(shape[0] / n)
    return max(0, min(c, shape[0] - rank * c))


def zero1_partition(sizes: list[int], n: int) -> list[list[int]]:
    """ZeroRedundancyOptimizer's partition, re-derived: parameters sorted by size (largest first, stable),
    each given whole to the rank with the fewest elements so far (the lowest rank on a tie).
    Returns the parameter indices of each rank."""
    totals, owned = [0] * n, [[] for _ in range(n)]
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        r = totals.index(min(totals))
        owned[r].append(i)
        totals[r] += sizes[i]
    return owned


ZERO1 = Layout(1, False, False, True, cut="whole", gather="broadcast", master_shard=False,
               note="zero1: ZeroRedundancyOptimizer partitions whole parameters greedily (largest first, to "
                    "the least-loaded rank), so each rank's optimizer state is its parameters' state, "
                    "uneven across ranks (see memory_per_rank); jaxdp shards flat, padded buffers evenly")
ZERO2 = Layout(2, False, True, True, cut="flat", gather="all-gather", master_shard=True,
               note="zero2: `master_params` is the shard of the parameters each rank updates (a copy of its "
                    "part of the flat padded vector), held next to the full parameters")
ZERO3 = Layout(3, True, True, True, cut="dim0", gather="unit all-gather", master_shard=False,
               note="zero3: FSDP2 shards each parameter along dim 0 (rows padded to a multiple of n), not a "
                    "flat buffer; the last ranks hold fewer rows. Each layer is all-gathered before forward "
                    "and again before backward")
HSDP = ZERO3._replace(  # zero3 within a group of S = N / R ranks, the shard all-reduced across the R groups
    note="hsdp: each collective counted over its own process group (comm_groups: the S ranks of a shard group, "
         "the R replicas of a shard, or the world for the loss); comm_groups splits the bytes within a group "
         "(bytes_intra_group) from those across the groups (bytes_inter_group)")
LAYOUTS = {e.name: globals()[e.layout] for e in registry.ENTRIES if e.comm == "zero"}  # each row named by its entry
LAYOUTS |= {alias: LAYOUTS[name] for alias, name in registry.ALIASES.items()}
REPLICATED = Layout(0, False, False, False, cut="whole", gather="", master_shard=False, note="")


def of(strategy: str) -> Layout:
    """The layout of a strategy name: its ZeRO row, or a full copy on every rank."""
    return LAYOUTS.get(strategy, REPLICATED)
