"""`hsdp`: hybrid sharding (FSDP2's HSDP, DeepSpeed's hpZ/MiCS idea): zero3 within a group of S devices
(a node), replicated across R groups, N = R x S. `replicas=1` is zero3; `replicas=N` is ddp's
algorithm with zero3's code (groups of one device: nothing sharded, a gather of one shard is a copy).

The devices as a grid (`devices.grid`): R rows (`replica`) x S columns (`data`), row r = devices
[r S, (r+1) S) of the flat order. zero3's step runs on it unchanged (`zero/step.py`, `zero/zero3.py`):
- the parameters, gradients and optimizer state are flat shards over `data` (1/S each, padded to a
  multiple of S), the same in every row;
- each unit's parameters are all-gathered over `data` only (before its forward, and again before its
  backward with `reshard_after_forward`): the gathers never leave the group;
- each unit's gradient (/ N, the mean over all devices) is reduce-scattered over `data`, then its shard
  all-reduced (psum) over `replica` (`zero/flat.across_groups`). This order, not an all-reduce across
  groups first: after the reduce-scatter each device holds Psi / S elements, so only 2 (R-1)/R x Psi/S
  per device cross the slow links between groups; reducing across groups first would send
  2 (R-1)/R x Psi per device there, S times more. Under accumulation the full local gradients are summed
  over the micro-batches and synced once, after the loop (FSDP's no_sync);
- the batch is split over both axes, replica-major: device (r, s) holds block r S + s, which is device
  k's block of the flat order (`data.micro_major` / `part_rows` unchanged, traces equal single's);
- the optimizer runs on the global flat arrays (sharded over `data`, replicated over `replica`): a clip
  in the chain takes the norm of the whole gradient, the sum of squares over `data` only, since every
  row holds the same shards after the all-reduce. `reduction="canonical"`: zero3's, the tree over
  the group then over the groups (`zero2.canonical_scatter`), the norm over `data` (the same bits as
  `single` on any R x S with N | shards).

`--collectives ring` puts zero3's rings within the group; the all-reduce across groups is lax.psum. A
model with running statistics (BatchNorm) is refused: its statistics program runs on the 1-D mesh.
"""
from __future__ import annotations

from ..core.run.config import ConfigError
from ..devices import AXIS, grid
from .zero import zero3
from .zero.layout import HSDP
from .zero.step import make_strategy

_on_grid = make_strategy(HSDP, zero3.grads, zero3.canonical_grads, name="hsdp")


def make(problem, optimizer, mesh, opts, return_grads=True):
    """zero3's strategy on the R x S grid of `mesh`'s devices (R = opts.replicas); `mesh` may be the
    grid itself (axes `replica`, `data`)."""
    n = mesh.size
    if n % opts.replicas:
        divisors = ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
        raise ConfigError(f"replicas={opts.replicas} does not divide the {n} devices; give one of {divisors}")
    if problem.state is not None:
        raise ConfigError("hsdp does not run a model with running statistics (BatchNorm); use --strategy zero3")
    if mesh.axis_names == (AXIS,):
        mesh = grid(mesh, opts.replicas, opts.hsdp_hosts)
    return _on_grid(problem, optimizer, mesh, opts, return_grads)
