"""What torch_ref's strategies should communicate and hold, by formula: the theory that
`torch_ref.analysis.accounting` (the measurement) is set against. The torch twin of the theory half of
`jaxdp/analysis/accounting.py`; conventions (bytes each device sends by the ring algorithm) in that module's
docstring and in `torch_ref/analysis/accounting.py`'s.

`theory(strategy, ...)`: bytes per step and device, Psi = total elements, b = the item size. Every
strategy but dp adds the loss's mean for the log: one scalar all-reduce (2 (n-1)/n b).
  ddp, ddp-naive, ddp-bucket  all-reduce 2 (n-1)/n Psi b (DDP's buckets, one per parameter, ours)
  ddp-ring                    point-to-point 2 (n-1) ceil(Psi/n) b (N-1 rounds of reduce-scatter
                              and N-1 of all-gather, one padded chunk each)
  zero1, zero2, zero3, hsdp   read from the stage's row of `strategies/zero/layout.py` (`zero_theory`),
                              with P = `Layout.padded` (Psi; n ceil(Psi/n) for one flat vector; FSDP2's
                              dim-0 padding F = fsdp_padded(all)) in a group of S = n / R ranks (R = 1
                              but for hsdp): the gradient all-reduced 2 (S-1)/S P b where every rank
                              keeps it whole, else reduce-scattered (on gloo an all-reduce of P,
                              2 (S-1)/S P b; on nccl (S-1)/S P b) and its shard all-reduced across the
                              R groups, 2 (R-1)/R P/S b (`inter_group_theory`); the parameters back by
                              the row's `gather` after the update, (S-1)/S P b (zero1: broadcast from
                              each owner; zero2: all-gather), or, sharded (zero3), per unit and
                              micro-batch (`accum`) all-gathered before forward and again before
                              backward, (S-1)/S (2 F - R) b, R = fsdp_padded(root_params), the root's
                              own only once (reshard_after_forward=False: F once); clipping: an
                              all-reduce of `Layout.norms` values (none, one sum of squares, or one
                              norm per parameter tensor: clip_grad_norm_ on DTensors)
  dp                          reduce (n-1)/n (Psi + 1) b (the gradients and the loss), broadcast
                              (n-1)/n (Psi + 1) b (the parameters and the global loss)
"""
from __future__ import annotations

import math
from typing import NamedTuple

from jaxdp.core.registry import strategies as registry

from ..strategies.zero import layout as zero_layout
from ..strategies.zero.layout import zero1_partition  # noqa: F401 (re-exported)

KINDS = ("all-reduce", "reduce-scatter", "all-gather", "point-to-point", "broadcast", "reduce")
STATE_TENSORS_PER_PARAM = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
STEP_COUNT_BYTES = {"sgd": 0, "momentum": 0, "adam": 4, "adamw": 4}  # torch.optim's float32 `step` per tensor


def _shape(p) -> tuple[int, ...]:
    return tuple(p) if isinstance(p, (tuple, list)) else (int(p),)


def fsdp_padded(shapes, n: int) -> int:
    """Elements FSDP2 all-gathers for these parameters (shapes or sizes): each padded along dim 0 to a multiple
    of n (`layout.fsdp_padded`)."""
    return zero_layout.fsdp_padded([_shape(s) for s in shapes], n)


def theory(
    strategy: str, param_sizes, n: int, itemsize: int, *, clip: bool = False, backend: str = "gloo", root_params=(),
    reshard_after_forward: bool = True, accum: int = 1, batchnorm: BatchNormCount | None = None, replicas: int = 1,
    inner_steps: int = 1,
) -> dict:
    """Bytes each device sends per step in what torch_ref runs, by kind (conventions: module docstring).

    `param_sizes`: the torch parameters' shapes (torch layout, Linear weight [out, in]) or sizes; zero3
    needs shapes (FSDP2 pads dim 0). A ZeRO stage's formula is read from its row of
    `strategies/zero/layout.py` (`zero_theory`), the others' from `REPLICATED_THEORY`; plus, for a model
    with BatchNorm (`batchnorm`: `batchnorm_theory`), its statistics' collectives. An "outer" strategy (diloco)
    all-reduces the parameters once every `inner_steps` K steps: 1/K of that all-reduce per step.
    """
    shapes = [_shape(p) for p in param_sizes]
    loss = 2 * (n - 1) / n * itemsize  # the loss's mean for the log (not dp's: it reduces the loss with the rest)
    if strategy in zero_layout.LAYOUTS:
        out = zero_theory(zero_layout.of(strategy), shapes, n // replicas, itemsize, clip, backend, root_params,
                          accum, reshard_after_forward, replicas)
        out["all-reduce"] += loss
    elif registry.get(strategy, "comm") in REPLICATED_THEORY:
        comm = registry.get(strategy, "comm")
        out = REPLICATED_THEORY[comm](sum(math.prod(s) for s in shapes), n, itemsize / (
            inner_steps if comm == "outer" else 1))
        out["all-reduce"] += loss if comm != "tree" else 0.0  # dp's tree reduces the loss with the rest
    elif registry.get(strategy, "comm") == "none":
        out = dict.fromkeys(KINDS, 0.0)
    else:
        raise ValueError(f"no communication theory for {strategy!r}")
    if batchnorm is not None:
        for kind, nbytes in batchnorm_theory(strategy, batchnorm, n, itemsize, accum).items():
            out[kind] += nbytes
    if n == 1 or registry.get(strategy, "one_device", False):
        out = dict.fromkeys(KINDS, 0.0)
    out["total"] = sum(out.values())
    return out


REPLICATED_THEORY = {  # the registry row's `comm` -> (psi, n, b -> bytes by kind): every rank holds the gradient
    "all-reduce": lambda psi, n, b: {**dict.fromkeys(KINDS, 0.0), "all-reduce": 2 * (n - 1) / n * psi * b},
    "ring": lambda psi, n, b: {**dict.fromkeys(KINDS, 0.0), "point-to-point": 2 * (n - 1) * math.ceil(psi / n) * b},
    "tree": lambda psi, n, b: {**dict.fromkeys(KINDS, 0.0), "reduce": (n - 1) / n * (psi + 1) * b,
                             "broadcast": (n - 1) / n * (psi + 1) * b},
}
REPLICATED_THEORY["outer"] = REPLICATED_THEORY["all-reduce"]  # diloco: its itemsize given as b / K


def zero_theory(layout, shapes: list[tuple], s: int, itemsize: int, clip: bool, backend: str, root_params,
                accum: int = 1, reshard_after_forward: bool = True, replicas: int = 1) -> dict:
    """A ZeRO stage's bytes by kind, from its row: the gradient's sync (all-reduce when every rank keeps it
    whole, else a reduce-scatter of the layout's padded elements in the group of `s` ranks, its shard then
    all-reduced across the `replicas` groups), the parameters back (after the update, by the row's
    `gather`; sharded parameters: per micro-batch, each unit's all-gather before forward and, with
    `reshard_after_forward`, again before backward, the root's own parameters only once), and the clip's
    norms."""
    out = dict.fromkeys(KINDS, 0.0)
    padded, part = layout.padded(shapes, s), (s - 1) / s
    if layout.shards_grads:
        _reduce_scatter(out, padded * itemsize, s, backend)
        out["all-reduce"] += 2 * (replicas - 1) / replicas * (padded // s) * itemsize
    else:
        out["all-reduce"] += 2 * part * padded * itemsize
    if layout.shards_params:
        root = zero_layout.fsdp_padded([_shape(p) for p in root_params], s)
        out["all-gather"] += part * ((2 * padded - root) if reshard_after_forward else padded) * accum * itemsize
    elif layout.gathers_after_update:
        out[layout.gather] += part * padded * itemsize
    out["all-reduce"] += 2 * part * layout.norms(shapes) * itemsize if clip else 0.0
    return out


class BatchNormCount(NamedTuple):
    """A model's BatchNorm layers, as `theory` counts their collectives (`batchnorm_count(model)`)."""
    channels: int     # over every layer
    layers: int
    sync: bool        # --batchnorm sync (else local)


DDP_BUFFERS = registry.tagged("ddp-buffers")  # wrapped in DistributedDataParallel (broadcast_buffers=True)


def batchnorm_theory(strategy: str, bn: BatchNormCount, n: int, itemsize: int, accum: int = 1) -> dict:
    """Bytes each rank sends per step for BatchNorm (torch_ref/batchnorm.py), by kind, C = bn.channels:
      sync     per micro-batch, all-reduces of the mean and of the biased variance (forward) and of
               their cotangents (backward, the autograd Function's): 4 C values, 2 (n-1)/n each;
      local    per micro-batch, rank 0's running mean and variance broadcast after each forward
               (DDP's broadcast_buffers=True, done by the layer under every strategy): 2 C, (n-1)/n;
      DDP      (ddp, zero1: DistributedDataParallel's own broadcast_buffers, once per step, both modes)
               every buffer, running mean and variance and the int64 `num_batches_tracked` of each
               layer: (2 C + layers) values, (n-1)/n, counted in the master dtype's itemsize (exact
               for float64 runs, whose int64 counters have the same 8 bytes)."""
    out = dict.fromkeys(KINDS, 0.0)
    if n == 1 or registry.get(strategy, "one_device", False) or not bn.layers:
        return out
    ring, part = 2 * (n - 1) / n, (n - 1) / n
    if bn.sync:
        out["all-reduce"] = ring * 4 * bn.channels * accum * itemsize
    else:
        out["broadcast"] = part * 2 * bn.channels * accum * itemsize
    if strategy in DDP_BUFFERS:
        out["broadcast"] += part * (2 * bn.channels + bn.layers) * itemsize
    return out


def batchnorm_count(model, sync: bool) -> BatchNormCount | None:
    """The BatchNorm layers of a torch `model` (None without any)."""
    from torch import nn

    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    return BatchNormCount(sum(m.num_features for m in layers), len(layers), sync) if layers else None


def inter_group_theory(param_sizes, n: int, replicas: int, itemsize: int) -> float:
    """The bytes of hsdp's `theory` total that cross its R groups: each rank's padded shard (F / S,
    F = fsdp_padded(all, S)) all-reduced across them, 2 (R-1)/R F/S b, and the loss's all-reduce over the
    world (it crosses them too); the rest, `bytes_intra_group`, stays in a group of S = n / R ranks.
    One group (R = 1, every other strategy): nothing crosses. jaxdp.analysis.theory.inter_group_theory's twin."""
    if replicas == 1 or n == 1:
        return 0.0
    s = n // replicas
    return 2 * (replicas - 1) / replicas * (fsdp_padded(param_sizes, s) // s) * itemsize + 2 * (n - 1) / n * itemsize


def _reduce_scatter(out: dict, nbytes: float, n: int, backend: str) -> None:
    """Add a reduce-scatter of `nbytes` as it runs: gloo has none and all-reduces the whole input."""
    if backend == "gloo":
        out["all-reduce"] += 2 * (n - 1) / n * nbytes
    else:
        out["reduce-scatter"] += (n - 1) / n * nbytes


def memory_theory(strategy: str, param_shapes, n: int, itemsize: int, optimizer: str, rank: int = 0,
                  replicas: int = 1) -> dict:
    """Bytes rank `rank` holds, by what each torch strategy keeps (see docs/TORCH_REF.md), a ZeRO stage's
    read from its row of `strategies/zero/layout.py` (each sharded part: `Layout.mine`):
    dp's workers (rank > 0): params only (no optimizer; their gradients are sent, never synced)
    replicated (ddp*, dp's rank 0): params, grads Psi b; state K Psi b (+ 4 bytes per parameter tensor
                                    for Adam's step counts)
    zero1: params, grads Psi b; state K b x the elements of the *whole parameters* this rank owns
           (`zero1_partition`: uneven, a rank may own nothing), step counts of those only
    zero2: params Psi b; master shard, grads and state ceil(Psi/n) b each (K for the state) + one step
    zero3: params, grads and state: FSDP2's local shard of each parameter, rows
           [r c, min((r+1) c, dim0)) with c = ceil(dim0/n); step counts for every parameter tensor
    hsdp: zero3's within its group of S = n / replicas ranks (its column s = rank mod S)
    """
    row = zero_layout.of(strategy)
    if registry.get(strategy, "grid", False):  # hsdp: zero3 within its group of S ranks, as its column s = rank mod S
        n, rank = n // replicas, rank % (n // replicas)
    shapes = [_shape(p) for p in param_shapes]
    k, step = STATE_TENSORS_PER_PARAM[optimizer], STEP_COUNT_BYTES[optimizer]
    whole = (sum(math.prod(s) for s in shapes), len(shapes))
    mine = row.mine(shapes, n, rank) if row.stage else whole  # (elements, tensors) of a sharded part
    held = {part: mine if sharded else whole for part, sharded in row.sharded.items()}
    out = {
        "params": held["params"][0] * itemsize,
        "grads": held["grads"][0] * itemsize,
        "opt_state": k * held["opt_state"][0] * itemsize + step * held["opt_state"][1],
        "master_params": mine[0] * itemsize if row.master_shard else 0,
    }
    if registry.get(strategy, "comm") == "tree" and rank != 0:  # dp's workers: no optimizer, gradients only sent
        out.update(grads=0, opt_state=0)
    return out
