"""What torch_ref's strategies should communicate and hold, by formula: the theory that
`torch_ref.accounting` (the measurement) is set against. The torch twin of the theory half of
`jaxdp/analysis/accounting.py`; conventions (bytes each device sends by the ring algorithm) in that module's
docstring and in `torch_ref/accounting.py`'s.

`theory(strategy, ...)`: bytes per step and device, Psi = total elements, b = the item size. Every
strategy but dp adds the loss's mean for the log: one scalar all-reduce (2 (n-1)/n b).
  ddp, ddp-naive, ddp-bucket  all-reduce 2 (n-1)/n Psi b (DDP's buckets, one per parameter, ours)
  ddp-ring                    point-to-point 2 (n-1) ceil(Psi/n) b (N-1 rounds of reduce-scatter
                              and N-1 of all-gather, one padded chunk each)
  zero1                       DDP's all-reduce + ZeroRedundancyOptimizer's broadcast of every
                              parameter from its owner: broadcast (n-1)/n Psi b
  zero2                       reduce-scatter of the flat gradient padded to P = n ceil(Psi/n):
                              on gloo an all-reduce of P (2 (n-1)/n P b), on nccl (n-1)/n P b;
                              all-gather of the parameters (n-1)/n P b; clipping: one scalar all-reduce
  zero3 (FSDP2)               per unit and micro-batch (`accum`), all-gather before forward and again
                              before backward
                              (not with reshard_after_forward=False: F once; the root's own
                              `root_params` only once): (n-1)/n (2 F - R) b with
                              F = fsdp_padded(all), R = fsdp_padded(root_params); gradient
                              reduce-scatter of F: on gloo all-reduce 2 (n-1)/n F b, on nccl
                              (n-1)/n F b; clipping: one all-reduce of the parameter tensors'
                              norms, stacked (clip_grad_norm_ on DTensors: one element each)
  hsdp (R groups of S = n/R)   zero3's, with S for n (F = fsdp_padded(all, S)), + the all-reduce of each
                              rank's shard across the R groups: 2 (R-1)/R F/S b (`inter_group_theory`);
                              clipping: the norms' all-reduce within the group (S for n)
  dp                          reduce (n-1)/n (Psi + 1) b (the gradients and the loss), broadcast
                              (n-1)/n (Psi + 1) b (the parameters and the global loss)
"""
from __future__ import annotations

import math
from typing import NamedTuple

KINDS = ("all-reduce", "reduce-scatter", "all-gather", "point-to-point", "broadcast", "reduce")
STATE_TENSORS_PER_PARAM = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
STEP_COUNT_BYTES = {"sgd": 0, "momentum": 0, "adam": 4, "adamw": 4}  # torch.optim's float32 `step` per tensor


def _shape(p) -> tuple[int, ...]:
    return tuple(p) if isinstance(p, (tuple, list)) else (int(p),)


def fsdp_padded(shapes, n: int) -> int:
    """Elements FSDP2 all-gathers for these parameters: each is padded along dim 0 to a multiple of n."""
    return sum(math.ceil(s[0] / n) * n * math.prod(s[1:]) for s in map(_shape, shapes))


def theory(
    strategy: str, param_sizes, n: int, itemsize: int, *, clip: bool = False, backend: str = "gloo", root_params=(),
    reshard_after_forward: bool = True, accum: int = 1, batchnorm: BatchNormCount | None = None, replicas: int = 1,
) -> dict:
    """Bytes each device sends per step in what torch_ref runs, by kind (conventions: module docstring).

    `param_sizes`: the torch parameters' shapes (torch layout, Linear weight [out, in]) or sizes; zero3
    needs shapes (FSDP2 pads dim 0). Each strategy's formula: the module docstring's table, plus, for a
    model with BatchNorm (`batchnorm`: `batchnorm_theory`), its statistics' collectives.
    """
    shapes = [_shape(p) for p in param_sizes]
    psi = sum(math.prod(s) for s in shapes)
    ring, part = 2 * (n - 1) / n, (n - 1) / n
    out = {k: 0.0 for k in KINDS}
    loss = ring * itemsize
    if strategy in ("ddp", "ddp-naive", "ddp-bucket"):
        out["all-reduce"] = ring * psi * itemsize + loss
    elif strategy == "ddp-ring":
        out["point-to-point"] = 2 * (n - 1) * math.ceil(psi / n) * itemsize
        out["all-reduce"] = loss
    elif strategy == "zero1":
        out["all-reduce"] = ring * psi * itemsize + loss
        out["broadcast"] = part * psi * itemsize
    elif strategy == "zero2":
        padded = n * math.ceil(psi / n)
        out["all-reduce"] = loss + (ring * itemsize if clip else 0.0)
        _reduce_scatter(out, padded * itemsize, n, backend)
        out["all-gather"] = part * padded * itemsize
    elif strategy in ("zero3", "hsdp"):
        s = n // replicas  # hsdp: zero3 within a group of S ranks, then the shard all-reduced across R groups
        full, root = fsdp_padded(shapes, s), fsdp_padded(root_params, s)
        out["all-gather"] = (s - 1) / s * ((2 * full - root) if reshard_after_forward else full) * accum * itemsize
        out["all-reduce"] = loss + (2 * (s - 1) / s * len(shapes) * itemsize if clip else 0.0)  # norms: in the group
        _reduce_scatter(out, full * itemsize, s, backend)
        out["all-reduce"] += 2 * (replicas - 1) / replicas * (full // s) * itemsize
    elif strategy == "dp":
        out["reduce"] = part * (psi + 1) * itemsize
        out["broadcast"] = part * (psi + 1) * itemsize
    elif strategy != "single":
        raise ValueError(f"no communication theory for {strategy!r}")
    if batchnorm is not None:
        for kind, nbytes in batchnorm_theory(strategy, batchnorm, n, itemsize, accum).items():
            out[kind] += nbytes
    if n == 1 or strategy == "single":
        out = {k: 0.0 for k in KINDS}
    out["total"] = sum(out.values())
    return out


class BatchNormCount(NamedTuple):
    """A model's BatchNorm layers, as `theory` counts their collectives (`batchnorm_count(model)`)."""
    channels: int     # over every layer
    layers: int
    sync: bool        # --batchnorm sync (else local)


DDP_BUFFERS = ("ddp", "zero1")  # wrapped in DistributedDataParallel (broadcast_buffers=True)


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
    if n == 1 or strategy == "single" or not bn.layers:
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


def memory_theory(strategy: str, param_shapes, n: int, itemsize: int, optimizer: str, rank: int = 0,
                  replicas: int = 1) -> dict:
    """Bytes rank `rank` holds, by what each torch strategy keeps (see docs/TORCH_REF.md):
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
    if strategy == "hsdp":
        strategy, n, rank = "zero3", n // replicas, rank % (n // replicas)
    shapes = [_shape(p) for p in param_shapes]
    sizes = [math.prod(s) for s in shapes]
    psi, k, step = sum(sizes), STATE_TENSORS_PER_PARAM[optimizer], STEP_COUNT_BYTES[optimizer]
    out = {
        "params": psi * itemsize,
        "grads": psi * itemsize,
        "opt_state": (k * psi * itemsize + step * len(sizes)),
        "master_params": 0,
    }
    if strategy == "dp" and rank != 0:  # workers: no optimizer; their gradients are only sent
        out.update(grads=0, opt_state=0)
    elif strategy == "zero1":
        mine = zero1_partition(sizes, n)[rank]
        out["opt_state"] = sum(k * sizes[i] * itemsize + step for i in mine)
    elif strategy == "zero2":
        shard = math.ceil(psi / n)
        out.update(grads=shard * itemsize, master_params=shard * itemsize, opt_state=k * shard * itemsize + step)
    elif strategy == "zero3":

        def local(s):
            c = math.ceil(s[0] / n)
            return max(0, min(c, s[0] - rank * c)) * math.prod(s[1:])

        mine = sum(local(s) for s in shapes)
        out.update(params=mine * itemsize, grads=mine * itemsize, opt_state=k * mine * itemsize + step * len(shapes))
    return out
