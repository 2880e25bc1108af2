"""What torch_ref's strategies communicate and hold, measured, next to the formula of what they run.
The torch twin of `jaxdp/accounting.py` (same kinds, same ring conventions, bytes per device per step).

Communication is read from what the process group ran: `torch.profiler` records every backend
collective as an event named `gloo:<op>` (`nccl:<op>` on GPU) with its input's shape, including
those DDP's reducer, ZeroRedundancyOptimizer and FSDP2 issue from inside. The op that ran is counted,
not the one asked for: gloo has no reduce-scatter and runs `c10d::_reduce_scatter_base_` as
`gloo:all_reduce` of the whole input (twice the bytes of a true reduce-scatter), and it is counted as
the all-reduce it is. The profiler records shapes, not dtypes: every tensor communicated here is in
the run's master dtype (float64, or float32 for float32 and bfloat16 runs), whose itemsize is used.

Bytes each device sends, by the ring (or pipelined) algorithm, as jaxdp.accounting:
    all-reduce of B bytes                2 (n-1)/n B
    reduce-scatter to an output of B     (n-1) B
    all-gather to an output of B         (n-1)/n B      (gloo records the input shard s: B = n s)
    broadcast of B bytes                 (n-1)/n B      (a pipelined broadcast: every device forwards
                                                         all but its share once; the root sends more
                                                         with a flat or tree broadcast)
    reduce of B bytes (dp)               (n-1)/n B      (the mirror of broadcast)
    point-to-point                       the bytes this rank sends (`gloo:send`; `recv` sends nothing)

Memory is the bytes of the tensors a rank holds (DTensor: its local shard): the model's parameters,
the gradients as held when the optimizer steps (after the sync: full for ddp and zero1, a shard for
zero2 and zero3), the optimizer state tensors (Adam's step counts included: one float32 scalar per
parameter tensor), and for zero2 its fp-master shard `main_param` (reported as `master_params`).
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.distributed as dist

KINDS = ("all-reduce", "reduce-scatter", "all-gather", "point-to-point", "broadcast", "reduce")
BACKEND_OPS = {"all_reduce": "all-reduce", "allreduce": "all-reduce", "reduce_scatter": "reduce-scatter",
               "all_gather": "all-gather", "allgather": "all-gather", "send": "point-to-point",
               "recv": "point-to-point", "broadcast": "broadcast", "reduce": "reduce"}
REQUESTED_REDUCE_SCATTER = (
    "c10d::_reduce_scatter_base_",
    "c10d::reduce_scatter_",
    "c10d::reduce_scatter_tensor_coalesced_",
)
STATE_TENSORS_PER_PARAM = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
STEP_COUNT_BYTES = {"sgd": 0, "momentum": 0, "adam": 4, "adamw": 4}  # torch.optim's float32 `step` per tensor


# ---- theory -------------------------------------------------------------------------------------
def _shape(p) -> tuple[int, ...]:
    return tuple(p) if isinstance(p, (tuple, list)) else (int(p),)


def fsdp_padded(shapes, n: int) -> int:
    """Elements FSDP2 all-gathers for these parameters: each is padded along dim 0 to a multiple of n."""
    return sum(math.ceil(s[0] / n) * n * math.prod(s[1:]) for s in map(_shape, shapes))


def theory(
    strategy: str, param_sizes, n: int, itemsize: int, *, clip: bool = False, backend: str = "gloo", root_params=(),
    reshard_after_forward: bool = True,
) -> dict:
    """Bytes each device sends per step in what torch_ref runs, by kind (conventions: module docstring).

    `param_sizes`: the torch parameters' shapes (torch layout, Linear weight [out, in]) or sizes; zero3
    needs shapes (FSDP2 pads dim 0). Psi = total elements, b = `itemsize`. Every strategy but dp adds
    the loss's mean for the log: one scalar all-reduce (2 (n-1)/n b).
      ddp, ddp-naive, ddp-bucket  all-reduce 2 (n-1)/n Psi b (DDP's buckets, one per parameter, ours)
      ddp-ring                    point-to-point 2 (n-1) ceil(Psi/n) b (N-1 rounds of reduce-scatter
                                  and N-1 of all-gather, one padded chunk each)
      zero1                       DDP's all-reduce + ZeroRedundancyOptimizer's broadcast of every
                                  parameter from its owner: broadcast (n-1)/n Psi b
      zero2                       reduce-scatter of the flat gradient padded to P = n ceil(Psi/n):
                                  on gloo an all-reduce of P (2 (n-1)/n P b), on nccl (n-1)/n P b;
                                  all-gather of the parameters (n-1)/n P b; clipping: one scalar all-reduce
      zero3 (FSDP2)               per unit, all-gather before forward and again before backward
                                  (not with reshard_after_forward=False: F once; the root's own
                                  `root_params` only once): (n-1)/n (2 F - R) b with
                                  F = fsdp_padded(all), R = fsdp_padded(root_params); gradient
                                  reduce-scatter of F: on gloo all-reduce 2 (n-1)/n F b, on nccl
                                  (n-1)/n F b; clipping: one all-reduce of the parameter tensors'
                                  norms, stacked (clip_grad_norm_ on DTensors: one element each)
      dp                          reduce (n-1)/n (Psi + 1) b (the gradients and the loss), broadcast
                                  (n-1)/n Psi b
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
        if backend == "gloo":
            out["all-reduce"] += ring * padded * itemsize
        else:
            out["reduce-scatter"] = part * padded * itemsize
        out["all-gather"] = part * padded * itemsize
    elif strategy == "zero3":
        full, root = fsdp_padded(shapes, n), fsdp_padded(root_params, n)
        out["all-gather"] = part * ((2 * full - root) if reshard_after_forward else full) * itemsize
        out["all-reduce"] = loss + (ring * len(shapes) * itemsize if clip else 0.0)
        if backend == "gloo":
            out["all-reduce"] += ring * full * itemsize
        else:
            out["reduce-scatter"] = part * full * itemsize
    elif strategy == "dp":
        out["reduce"] = part * (psi + 1) * itemsize
        out["broadcast"] = part * psi * itemsize
    elif strategy != "single":
        raise ValueError(f"no communication theory for {strategy!r}")
    if n == 1 or strategy == "single":
        out = {k: 0.0 for k in KINDS}
    out["total"] = sum(out.values())
    return out


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


def memory_theory(strategy: str, param_shapes, n: int, itemsize: int, optimizer: str, rank: int = 0) -> dict:
    """Bytes rank `rank` holds, by what each torch strategy keeps (see docs/TORCH_REF.md):
    dp's workers (rank > 0): params only (no optimizer; their gradients are sent, never synced)
    replicated (ddp*, dp's rank 0): params, grads Psi b; state K Psi b (+ 4 bytes per parameter tensor
                                    for Adam's step counts)
    zero1: params, grads Psi b; state K b x the elements of the *whole parameters* this rank owns
           (`zero1_partition`: uneven, a rank may own nothing), step counts of those only
    zero2: params Psi b; master shard, grads and state ceil(Psi/n) b each (K for the state) + one step
    zero3: params, grads and state: FSDP2's local shard of each parameter, rows
           [r c, min((r+1) c, dim0)) with c = ceil(dim0/n); step counts for every parameter tensor
    """
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


# ---- measurement (in each rank) -----------------------------------------------------------------
def _local_bytes(t) -> int:
    if t is None or not torch.is_tensor(t):
        return 0
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def _events(prof) -> tuple[dict, dict, dict]:
    """(sent bytes by kind, ops by kind, requested c10d ops) from one profiled step, in elements x
    conventions (multiplied by the itemsize later)."""
    n = dist.get_world_size()
    sent, ops, requested = {k: 0.0 for k in KINDS}, {k: 0 for k in KINDS}, {}
    for e in prof.events():
        name = e.name
        if name.startswith("c10d::"):
            requested[name] = requested.get(name, 0) + 1
            continue
        backend, _, op = name.partition(":")
        if backend not in ("gloo", "nccl") or op not in BACKEND_OPS:
            continue
        kind = BACKEND_OPS[op]
        shape = e.input_shapes[0] if e.input_shapes else []
        elems = math.prod(shape) if shape else 1
        ops[kind] += 1
        if kind == "all-reduce":
            sent[kind] += 2 * (n - 1) / n * elems
        elif kind == "all-gather":  # the input is this rank's shard; the output n times it
            sent[kind] += (n - 1) * elems
        elif kind == "reduce-scatter":  # the input is the whole; the output 1/n of it
            sent[kind] += (n - 1) / n * elems
        elif kind in ("broadcast", "reduce"):
            sent[kind] += (n - 1) / n * elems
        elif op == "send":
            sent[kind] += elems
    return sent, ops, requested


def measure_rank(rank: int, n: int, cfg, init: dict, steps: int = 2, warmup: int = 1) -> dict:
    """Run `warmup` steps, then `steps` steps of `cfg` on this rank under the profiler; return this
    rank's view. The warm-up steps hold what happens once: DDP's broadcast of its bucket layout
    (int64 indices, in its first forward here), FSDP2's lazy initialisation."""
    from torch.profiler import ProfilerActivity, profile

    from jaxdp import data

    from . import launch, models, strategies

    device = launch.rank_device(cfg.platform, rank)
    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    model = models.load_flax(models.build(cfg, dataset).to(device), init)
    strategy = strategies.make(cfg.strategy, model, cfg, return_grads=False)
    held = strategy.checkpoint  # the model and this rank's optimizer, as checkpoints see them
    optimizer = getattr(held, "optimizer", None)
    tensors = {id(p): p for p in held.model.parameters()}
    if optimizer is not None:
        tensors.update({id(p): p for g in optimizer.param_groups for p in g["params"]})
    grads_at_step = []
    if optimizer is not None:  # gradients as the update sees them: after the sync, before they are freed
        optimizer.register_step_pre_hook(
            lambda *_: grads_at_step.append(sum(_local_bytes(p.grad) for p in tensors.values()))
        )
    input_dtype = models.numpy_master_dtype(cfg.dtype)
    rows = slice(rank * cfg.batch_size // n, (rank + 1) * cfg.batch_size // n)
    per_step, times = [], []
    for k in range(1, warmup + steps + 1):
        x, y = dataset.batch(k, cfg.batch_size)
        x = x.astype(input_dtype) if np.issubdtype(x.dtype, np.floating) else x.astype(np.int64)
        xs, ys = torch.from_numpy(x[rows]).to(device), torch.from_numpy(y[rows].astype(np.int64)).to(device)
        if k <= warmup:
            strategy.step(xs, ys)
            continue
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            t0 = time.perf_counter()
            float(strategy.step(xs, ys)["loss"])
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        per_step.append(_events(prof))
    params = sum(_local_bytes(p) for p in held.model.parameters())
    master = sum(_local_bytes(p) for p in tensors.values()) - params  # zero2's main_param
    state = 0
    if optimizer is not None:
        state = sum(_local_bytes(v) for s in optimizer.state.values() for v in s.values())
    return {
        "rank": rank,
        "per_step": per_step,
        "step_times": times,
        "memory": {
            "params": params,
            "grads": grads_at_step[-1] if grads_at_step else 0,
            "opt_state": state,
            "master_params": master,
        },
    }


def summarise(cfg, views: list[dict]) -> dict:
    """The report's dict from every rank's `measure_rank` view (rank 0's numbers, per-rank lists)."""
    from . import models

    itemsize = np.dtype(models.numpy_master_dtype(cfg.dtype)).itemsize
    notes = [
        f"communication: what the process group ran ({', '.join(sorted({dist_backend(cfg)}))} ops seen by "
        f"torch.profiler), bytes sent per device per step, ring conventions; dtype = master dtype "
        f"({itemsize} bytes)",
        "broadcast and reduce of B bytes are counted as (n-1)/n B per device (a pipelined ring broadcast); "
        "gloo's own algorithm may load the root more",
    ]
    per_rank_comm = []
    for v in views:
        steps = len(v["per_step"])
        comm = {k: sum(s[0][k] for s in v["per_step"]) / steps * itemsize for k in KINDS}
        comm["total"] = sum(comm.values())
        per_rank_comm.append(comm)
    view0 = views[0]
    first = view0["per_step"][0]
    if any(s[1] != first[1] for s in view0["per_step"][1:]):
        notes.append("the steps did not all run the same collectives; the numbers are their mean")
    comm_ops = {k: sum(s[1][k] for s in view0["per_step"]) / len(view0["per_step"]) for k in KINDS}
    requested = first[2]
    asked_rs = sum(requested.get(name, 0) for name in REQUESTED_REDUCE_SCATTER)
    if asked_rs and comm_ops["reduce-scatter"] == 0:
        notes.append(
            f"{asked_rs} reduce-scatter(s) asked for per step ran as all-reduce(s) of the whole input "
            f"(gloo has no reduce-scatter): 2(n-1)/n of the input's bytes instead of (n-1)/n, twice "
            f"the bytes of a true reduce-scatter; counted as the all-reduces they are"
        )
    if cfg.strategy == "zero1":
        notes.append(
            "zero1: ZeroRedundancyOptimizer partitions whole parameters greedily (largest first, to "
            "the least-loaded rank), so each rank's optimizer state is its parameters' state, "
            "uneven across ranks (see memory_per_rank); jaxdp shards flat, padded buffers evenly"
        )
    if cfg.strategy == "zero2":
        notes.append(
            "zero2: `master_params` is the shard of the parameters each rank updates (a copy of its "
            "part of the flat padded vector), held next to the full parameters"
        )
    if cfg.strategy == "zero3":
        notes.append(
            "zero3: FSDP2 shards each parameter along dim 0 (rows padded to a multiple of n), not a "
            "flat buffer; the last ranks hold fewer rows. Each layer is all-gathered before forward "
            "and again before backward"
        )
    notes.append("step_times were taken with the profiler on; use torch_ref.train.RunResult.step_times for speed")
    out = {
        "strategy": cfg.strategy,
        "devices": cfg.devices,
        "itemsize": itemsize,
        "comm": per_rank_comm[0],
        "comm_ops": comm_ops,
        "comm_requested": requested,
        "memory": view0["memory"],
        "memory_per_rank": [v["memory"] for v in views],
        "step_times": [max(v["step_times"][i] for v in views) for i in range(len(view0["step_times"]))],
        "notes": notes,
    }
    if any(c != per_rank_comm[0] for c in per_rank_comm[1:]):
        out["comm_per_rank"] = per_rank_comm
    return out


def dist_backend(cfg) -> str:
    from . import launch

    return launch.backend_for(launch.rank_device(cfg.platform, 0))


def measure(cfg, steps: int = 2, warmup: int = 1, timeout_s: float = 600.0) -> dict:
    """Launch cfg.devices ranks, run `warmup` steps and then `steps` steps of cfg's strategy under the
    profiler (only those are counted), and return
    {comm: {kind: bytes sent per device per step, total}, comm_ops: {kind: ops per step},
     comm_requested: {c10d op: count}, memory: {params, grads, opt_state, master_params} (rank 0),
     memory_per_rank: [...], step_times: [s per step, the slowest rank's], notes: [...],
     comm_per_rank: [...] only where ranks differ}."""
    from jaxdp import data

    from . import launch, models

    cfg = cfg.validate("torch")
    init = models.jax_init(cfg, data.load(cfg.data, cfg.seed, cfg.seq_len))
    views = launch.launch(
        measure_rank, cfg.devices, cfg, init, steps, warmup, platform=cfg.platform, timeout_s=timeout_s
    )
    return summarise(cfg, views)
