"""Communication theory for jaxdp's compiled steps: the bytes each device sends per step by the textbook
algorithms (ring collectives), by kind, set against what `jaxdp.analysis.accounting` reads from the compiled
HLO. The twin of torch_ref/analysis/theory.py; conventions in `jaxdp.analysis.accounting.collectives`. Re-exported by
`jaxdp.analysis.accounting` (its callers name it there)."""
from __future__ import annotations

import math

import jax
import numpy as np
from jax.extend.core import Literal

from .. import models
from ..core.registry import strategies as registry
from ..models import units
from ..strategies.jit import layout as jit_layout
from ..strategies.zero import layout as zero_layout


def dp_theory(sizes: list[int], n: int, itemsize: int, loss_itemsize: int | None = None) -> dict:
    """`dp`'s binomial tree: the reduce to device 0 and the broadcast from it each move N-1
    messages of Psi values in all, so the mean device sends 2 (N-1)/N Psi (the busiest, device 0,
    sends ceil(log2 N) Psi in the broadcast). The loss takes the same tree (reduced to device 0,
    broadcast back for every process's log): one more value, in the loss's dtype."""
    psi = sum(sizes) * itemsize + (loss_itemsize or itemsize)
    p2p = 2 * (n - 1) / n * psi if n > 1 else 0.0
    return {"all-reduce": 0.0, "reduce-scatter": 0.0, "all-gather": 0.0, "point-to-point": p2p, "total": p2p}


def theory(strategy: str, sizes: list[int], n: int, itemsize: int, loss_itemsize: int | None = None,
           accum: int = 1, reshard_after_forward: bool = True, root_sizes: list[int] = (), replicas: int = 1,
           inner_steps: int = 1) -> dict:
    """Bytes each device sends per step by the textbook algorithms (ring collectives), by kind.
    Psi = sum(sizes); Psi_N = sum(ceil(size / n)) (ZeRO pads each parameter to a multiple of n).
    The loss is averaged for the log by one scalar all-reduce (not for `dp`, whose tree is counted
    separately, nor for one device). zero3 gathers every micro-batch (`accum`) for forward and,
    with `reshard_after_forward`, again for backward, except `root_sizes` (its root's: a tied weight,
    `root_sizes` among `sizes` once), gathered once per micro-batch; the others sync once per step.
    hsdp (`replicas` R): zero3's bytes within a group of S = N / R (Psi_S = sum(ceil(size / S)), each
    parameter padded to a multiple of S), plus the all-reduce of each device's shard across the R groups,
    2 (R-1)/R Psi_S; `inter_group_theory` splits the total into within and across the groups.
    An "outer" strategy (diloco) all-reduces the parameters once every `inner_steps` K steps: 1/K of that
    all-reduce per step, beside the loss's scalar on every step."""
    psi = sum(sizes)
    loss = 2 * (n - 1) / n * (loss_itemsize or itemsize)
    ring = 2 * (n - 1) / n
    out = {"all-reduce": loss, "reduce-scatter": 0.0, "all-gather": 0.0, "point-to-point": 0.0}
    comm = registry.get(strategy, "comm")  # its family in the theory (jaxdp/core/registry/strategies.py)
    if comm in ("all-reduce", "outer"):
        out["all-reduce"] += ring * psi * itemsize / (inner_steps if comm == "outer" else 1)
    elif comm == "ring":
        out["point-to-point"] = 2 * (n - 1) * math.ceil(psi / n) * itemsize
    elif strategy in zero_layout.LAYOUTS:
        s = n // replicas  # the shard group (all N devices but for hsdp)
        psi_s = sum(math.ceil(size / s) for size in sizes)
        out.update(zero_theory(zero_layout.of(strategy), psi, psi_s, s, itemsize, accum, reshard_after_forward,
                               root_sizes, loss))
        out["all-reduce"] += across_groups(psi_s, replicas, itemsize)
    else:
        raise ValueError(f"no communication theory for {strategy!r}")
    if n == 1:
        out = {k: 0.0 for k in out}
    out["total"] = sum(out.values())
    return out


def across_groups(psi_s: int, replicas: int, itemsize: int) -> float:
    """hsdp's all-reduce of each device's gradient shard (Psi_S elements) across the R groups, ring."""
    return 2 * (replicas - 1) / replicas * psi_s * itemsize


def inter_group_theory(sizes: list[int], n: int, replicas: int, itemsize: int, loss_itemsize: int | None = None
                       ) -> float:
    """The bytes of `theory`'s total that cross the R groups of hsdp: the shards' all-reduce across them,
    2 (R-1)/R Psi_S b, and the loss's scalar all-reduce over all N devices (it crosses them too). The rest
    (`bytes_intra_group`: the gathers and reduce-scatters) stays within a group of S = N / R. One group
    (R = 1, every strategy but hsdp): nothing crosses."""
    if replicas == 1 or n == 1:
        return 0.0
    psi_s = sum(math.ceil(size / (n // replicas)) for size in sizes)
    return across_groups(psi_s, replicas, itemsize) + 2 * (n - 1) / n * (loss_itemsize or itemsize)


def zero_theory(layout, psi: int, psi_n: int, n: int, itemsize: int, accum: int, reshard_after_forward: bool,
                root_sizes: list[int], loss: float) -> dict:
    """A ZeRO stage's bytes by kind, read from its `layout` row: unsharded gradients are all-reduced
    (2(N-1)/N Psi), sharded ones reduce-scattered ((N-1) Psi_N); parameters gathered after the update
    once ((N-1) Psi_N), sharded ones every micro-batch for forward and, with `reshard_after_forward`,
    again for backward, except the root's (gathered once per micro-batch)."""
    out = {"all-reduce": loss, "reduce-scatter": 0.0}
    if layout.shards_grads:
        out["reduce-scatter"] = (n - 1) * psi_n * itemsize
    else:
        ring = 2 * (n - 1) / n
        out["all-reduce"] += ring * psi * itemsize
    gathers = accum * (2 if reshard_after_forward else 1) if layout.shards_params else 1
    root_n = sum(math.ceil(s / n) for s in root_sizes) if layout.shards_params else 0
    regathered = (gathers - accum) * root_n  # the root is gathered for forward only
    out["all-gather"] = (n - 1) * (psi_n * gathers - regathered) * itemsize
    return out


def root_sizes(problem) -> list[int]:
    """Sizes of the parameters zero3's root owns: those several units share (a tied weight)."""
    return [int(np.prod(leaf.shape)) for path in units.shared_paths(problem.units)
            for leaf in jax.tree.leaves(units.at(problem.params, path))]


# ---- BatchNorm's synchronised statistics (jaxdp/models/cnn.py, `--batchnorm sync`) -------------------
# Each BatchNorm layer of C channels, per micro-batch, all-reduces C-element vectors (in the master
# dtype: bf16 runs keep their statistics in f32):
#   forward   2: the pmean of the batch mean and the pmean of the biased variance;
#   backward  the transposes of the cross-device statistics' uses. Where the strategy's shard_map checks
#             replication (check_vma=True: ddp, ddp-bucket), each use of an invariant statistic
#             by varying rows is an implicit pcast whose transpose is a psum: the mean is used twice
#             (centring for the variance, and for the output), 1/sqrt(var + eps) once: 3. Unchecked
#             (check_vma=False, or pmap: dp, ddp-pmap, ddp-ring,
#             zero1/2/3), each pmean's transpose is one psum: 2;
#   zero3     +2 (sharded parameters, `layout.ZERO3`): its unit runs under jax.checkpoint
#             (dots_saveable), so backward recomputes the forward's two pmeans.
BN_FORWARD = 2
BN_BACKWARD = dict.fromkeys(registry.tagged("check-vma"), 3)  # ddp, ddp-bucket; the others: 2
BN_RECOMPUTED = {name: 2 for name, row in zero_layout.LAYOUTS.items() if row.shards_params}  # units remat


def _one_device(strategy: str) -> bool:
    return registry.get(strategy, "one_device", False)


def batchnorm_channels(problem) -> int:
    """Channels over every BatchNorm layer: the running means' elements (0 without running statistics)."""
    if problem.state is None:
        return 0
    return sum(int(np.size(leaf)) for path, leaf in jax.tree.flatten_with_path(problem.state)[0]
               if jax.tree_util.keystr(path).endswith("['mean']"))


def batchnorm_vectors(strategy: str) -> int:
    """C-channel vectors all-reduced per BatchNorm layer per micro-batch in `strategy`'s train step."""
    return BN_FORWARD + BN_BACKWARD.get(strategy, 2) + BN_RECOMPUTED.get(strategy, 0)


def batchnorm_theory(strategy: str, channels: int, n: int, itemsize: int, accum: int = 1) -> float:
    """Bytes each device sends per step for synchronised BatchNorm statistics (all-reduces, ring)."""
    if n == 1 or _one_device(strategy) or not channels:
        return 0.0
    return 2 * (n - 1) / n * accum * batchnorm_vectors(strategy) * channels * itemsize


def statistics_inputs(problem, x) -> list[int]:
    """Sizes of the parameters the running statistics depend on, for inputs shaped like `x`: the live
    inputs of `problem.update_state`'s jaxpr (equations walked backwards from its outputs). The others
    (for cnn: the last BatchNorm's scale and bias, the head) are dead code in the statistics' program,
    which XLA removes with their zero3 gathers."""
    leaves = jax.tree.leaves(problem.params)
    x = jax.ShapeDtypeStruct((1, *np.shape(x)[1:]), x.dtype)
    closed = jax.make_jaxpr(problem.update_state)(problem.params, problem.state, x)
    live = {v for v in closed.jaxpr.outvars if not isinstance(v, Literal)}
    for eqn in reversed(closed.jaxpr.eqns):
        if any(v in live for v in eqn.outvars):
            live.update(v for v in eqn.invars if not isinstance(v, Literal))
    return [int(np.size(p)) for p, v in zip(leaves, closed.jaxpr.invars[:len(leaves)], strict=True) if v in live]


def stats_theory(strategy: str, sizes: list[int], channels: int, n: int, itemsize: int, accum: int = 1,
                 sync: bool = True) -> dict:
    """Bytes each device sends in the running statistics' own program (jaxdp/strategies/stats.py), by
    kind: zero3 gathers the parameters the statistics read once (`sizes`: `statistics_inputs`;
    (n-1) Psi_N); under `sync`, each micro-batch's forward all-reduces every layer's mean and
    variance (2 C); and every device takes device 0's statistics, one psum of all of them (2 C).
    Nothing on one device or for `single`."""
    out = {"all-reduce": 0.0, "reduce-scatter": 0.0, "all-gather": 0.0, "point-to-point": 0.0}
    if n > 1 and not _one_device(strategy) and channels:
        ring = 2 * (n - 1) / n
        out["all-reduce"] = ring * (BN_FORWARD * accum * sync + 2) * channels * itemsize
        if zero_layout.of(strategy).shards_params:
            out["all-gather"] = (n - 1) * sum(math.ceil(s / n) for s in sizes) * itemsize
    out["total"] = sum(out.values())
    return out


def theory_for(cfg, sizes: list[int], root: list[int] = (), channels: int = 0, shapes=None) -> dict:
    """`theory` (or `dp_theory`) for a run configuration: its strategy, devices, master dtype,
    accumulation and zero3's reshard mode, plus the synchronised BatchNorm statistics of a model with
    `channels` BatchNorm channels (`batchnorm_theory`, under `--batchnorm sync`). No communication for
    `single` or one device. The -jit strategies shard each array by its shape: their theory
    (`jit/layout.theory`) reads `shapes` (the parameters' shapes, in `sizes`' order)."""
    itemsize = np.dtype(models.MASTER_DTYPE[cfg.dtype]).itemsize
    if _one_device(cfg.strategy) or cfg.devices == 1:
        return {"all-reduce": 0.0, "reduce-scatter": 0.0, "all-gather": 0.0, "point-to-point": 0.0, "total": 0.0}
    if cfg.strategy in jit_layout.LAYOUTS:
        return jit_layout.theory(jit_layout.LAYOUTS[cfg.strategy], shapes, cfg.devices, itemsize, cfg.accum)
    if registry.get(cfg.strategy, "comm") == "tree":
        out = dp_theory(sizes, cfg.devices, itemsize)
    else:
        out = theory(cfg.strategy, sizes, cfg.devices, itemsize, accum=cfg.accum,
                     reshard_after_forward=cfg.reshard_after_forward, root_sizes=root, replicas=cfg.replicas,
                     inner_steps=cfg.inner_steps)
    if cfg.batchnorm == "sync":
        out["all-reduce"] += batchnorm_theory(cfg.strategy, channels, cfg.devices, itemsize, cfg.accum)
        out["total"] = sum(v for k, v in out.items() if k != "total")
    return out


def group_theory_for(cfg, sizes: list[int], root: list[int] = (), channels: int = 0, shapes=None) -> dict:
    """`theory_for`'s total split into `bytes_intra_group` and `bytes_inter_group` (`inter_group_theory`)."""
    itemsize = np.dtype(models.MASTER_DTYPE[cfg.dtype]).itemsize
    total = theory_for(cfg, sizes, root, channels, shapes)["total"]
    inter = inter_group_theory(sizes, cfg.devices, cfg.replicas, itemsize)
    return {"bytes_intra_group": total - inter, "bytes_inter_group": inter}


def stats_theory_for(cfg, sizes: list[int], channels: int) -> dict:
    """`stats_theory` for a run configuration."""
    itemsize = np.dtype(models.MASTER_DTYPE[cfg.dtype]).itemsize
    return stats_theory(cfg.strategy, sizes, channels, cfg.devices, itemsize, cfg.accum, cfg.batchnorm == "sync")
