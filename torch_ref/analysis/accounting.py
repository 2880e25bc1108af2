"""What torch_ref's strategies communicate and hold, measured, next to the formula of what they run.
The torch twin of `jaxdp/analysis/accounting.py` (same kinds, same ring conventions, bytes per device per step).

Communication is read from what the process group ran: `torch.profiler` records every backend
collective as an event named `gloo:<op>` (`nccl:<op>` on GPU) with its input's shape, including
those DDP's reducer, ZeroRedundancyOptimizer and FSDP2 issue from inside. The op that ran is counted,
not the one asked for: gloo has no reduce-scatter and runs `c10d::_reduce_scatter_base_` as
`gloo:all_reduce` of the whole input (twice the bytes of a true reduce-scatter), and it is counted as
the all-reduce it is. The profiler records shapes, not dtypes: every tensor communicated here is in
the run's master dtype (float64, or float32 for float32 and bfloat16 runs), whose itemsize is used.

Bytes each device sends, by the ring (or pipelined) algorithm, as jaxdp.analysis.accounting:
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

import contextlib
import math
import time

import numpy as np
import torch
import torch.distributed as dist

from jaxdp.core.registry import strategies as registry

from .. import comm_groups, strategies
from ..strategies.zero import layout as zero_layout
from .profiler import profile
from .theory import (  # noqa: F401 (re-exported)
    KINDS,
    BatchNormCount,
    batchnorm_count,
    batchnorm_theory,
    fsdp_padded,
    inter_group_theory,
    memory_theory,
    theory,
    zero1_partition,
)

BACKEND_OPS = {"all_reduce": "all-reduce", "allreduce": "all-reduce", "reduce_scatter": "reduce-scatter",
               "all_gather": "all-gather", "allgather": "all-gather", "send": "point-to-point",
               "recv": "point-to-point", "broadcast": "broadcast", "reduce": "reduce"}
REQUESTED_REDUCE_SCATTER = (
    "c10d::_reduce_scatter_base_",
    "c10d::reduce_scatter_",
    "c10d::reduce_scatter_tensor_coalesced_",
)


# ---- measurement (in each rank) -----------------------------------------------------------------
def _local_bytes(t) -> int:
    if t is None or not torch.is_tensor(t):
        return 0
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def _held_bytes(tensors, optimizer) -> int:
    """Bytes of the tensors this rank holds between steps: parameters, gradients still held, the
    optimizer's state."""
    held = sum(_local_bytes(p) + _local_bytes(p.grad) for p in tensors)
    if optimizer is not None:
        held += sum(_local_bytes(v) for s in optimizer.state.values() for v in s.values())
    return held


def peak_rise(prof) -> int:
    """The most the step's allocations rose above what was held at its start: the running sum of
    the profiler's memory events (`profile_memory=True`: +bytes allocated, -bytes freed), at its
    highest, on the CPU (on a GPU the allocator's own peak is read instead)."""
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    running = peak = 0
    for e in events:
        running += e.nbytes()
        peak = max(peak, running)
    return peak


def _events(prof, shard: int | None = None) -> tuple[dict, dict, dict, dict]:
    """(sent bytes by kind, ops by kind, requested c10d ops, sent bytes within / across hsdp's groups of
    `shard` ranks) from one profiled step, in elements x conventions (multiplied by the itemsize later).
    Each collective's n is its process group's size (`comm_groups`, with `shard`; else the world's)."""
    world, events = dist.get_world_size(), list(prof.events())
    groups = comm_groups.backend_groups(events, world) if shard else {}
    sent, ops, requested = {k: 0.0 for k in KINDS}, {k: 0 for k in KINDS}, {}
    split = {"bytes_intra_group": 0.0, "bytes_inter_group": 0.0}
    for e in events:
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
        ranks = groups.get(id(e), range(world))
        n = len(ranks)
        ops[kind] += 1
        bytes_sent = {"all-reduce": 2 * (n - 1) / n * elems, "all-gather": (n - 1) * elems,  # gather: input = shard
                      "point-to-point": elems if op == "send" else 0.0}.get(kind, (n - 1) / n * elems)
        sent[kind] += bytes_sent
        crosses = len({r // (shard or world) for r in ranks}) > 1
        split["bytes_inter_group" if crosses else "bytes_intra_group"] += bytes_sent
    return sent, ops, requested, split


def _profiled_step(strategy, xs, ys, device, at_start: int, shard: int | None = None) -> tuple:
    """One step under the profiler: (its collectives as `_events`, its seconds, its peak bytes); with
    `shard` (hsdp), each collective's process group named (`comm_groups.GroupSpy`)."""
    from torch.profiler import ProfilerActivity

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    spy = comm_groups.GroupSpy() if shard else contextlib.nullcontext()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof, spy:
        t0 = time.perf_counter()
        float(strategy.step(xs, ys)["loss"])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else at_start + peak_rise(prof)
    return _events(prof, shard), seconds, peak


def measure_rank(rank: int, n: int, cfg, init: dict, steps: int = 2, warmup: int = 1) -> dict:
    """Run `warmup` steps, then `steps` steps of `cfg` on this rank under the profiler; return this
    rank's view. The warm-up steps hold what happens once: DDP's broadcast of its bucket layout
    (int64 indices, in its first forward here), FSDP2's lazy initialisation."""
    from jaxdp.core import data

    from .. import launch, models, train

    device = launch.rank_device(cfg.platform, rank)
    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    model = models.load_flax(models.build(cfg, dataset).to(device), init)
    strategy = train.strategy(model, cfg)
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
    per_step, times, peaks = [], [], []
    for k in range(1, warmup + steps + 1):
        x, y = dataset.batch(k, cfg.batch_size)
        x = x.astype(input_dtype) if np.issubdtype(x.dtype, np.floating) else x.astype(np.int64)
        x, y = (data.part_rows(a, rank, n, cfg.accum) for a in (x, y))  # the one layout (jaxdp.core.data.micro_major)
        xs, ys = torch.from_numpy(x).to(device), torch.from_numpy(y.astype(np.int64)).to(device)
        if k <= warmup:
            strategy.step(xs, ys)
            continue
        shard = n // cfg.replicas if registry.entry(cfg.strategy).grid else None  # each collective on its own group
        events, seconds, peak = _profiled_step(strategy, xs, ys, device, _held_bytes(tensors.values(), optimizer),
                                               shard)
        per_step.append(events)
        times.append(seconds)
        peaks.append(peak)
    params = sum(_local_bytes(p) for p in held.model.parameters())
    master = sum(_local_bytes(p) for p in tensors.values()) - params  # zero2's main_param
    state = 0
    if optimizer is not None:
        state = sum(_local_bytes(v) for s in optimizer.state.values() for v in s.values())
    return {
        "rank": rank,
        "per_step": per_step,
        "step_times": times,
        "peak_bytes": max(peaks),
        "memory": {
            "params": params,
            "grads": grads_at_step[-1] if grads_at_step else 0,
            "opt_state": state,
            "master_params": master,
        },
    }


def summarise(cfg, views: list[dict]) -> dict:
    """The report's dict from every rank's `measure_rank` view (rank 0's numbers, per-rank lists)."""
    from .. import models

    itemsize = np.dtype(models.numpy_master_dtype(cfg.dtype)).itemsize
    notes = [
        f"communication: what the process group ran ({', '.join(sorted({dist_backend(cfg)}))} ops seen by "
        f"torch.profiler), bytes sent per device per step, ring conventions; dtype = master dtype "
        f"({itemsize} bytes)",
        "broadcast and reduce of B bytes are counted as (n-1)/n B per device (a pipelined ring broadcast); "
        "gloo's own algorithm may load the root more",
    ]
    per_rank_comm, per_rank_groups = [], []
    for v in views:
        steps = len(v["per_step"])
        comm = {k: sum(s[0][k] for s in v["per_step"]) / steps * itemsize for k in KINDS}
        comm["total"] = sum(comm.values())
        per_rank_comm.append(comm)
        per_rank_groups.append({k: sum(s[3][k] for s in v["per_step"]) / steps * itemsize for k in v["per_step"][0][3]})
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
    notes += [strategies.twin_note(cfg.strategy)] if cfg.strategy in strategies.TWINS else []
    notes += [zero_layout.of(strategies.resolve(cfg.strategy)).note] if cfg.strategy in zero_layout.LAYOUTS else []
    out = {
        "strategy": cfg.strategy,
        "devices": cfg.devices,
        "itemsize": itemsize,
        "comm": per_rank_comm[0],
        "comm_groups": per_rank_groups[0],
        "comm_ops": comm_ops,
        "comm_requested": requested,
        "memory": view0["memory"],
        "peak_bytes": view0["peak_bytes"],
        "peak_bytes_per_rank": [v["peak_bytes"] for v in views],
        "memory_per_rank": [v["memory"] for v in views],
        "step_times": [max(v["step_times"][i] for v in views) for i in range(len(view0["step_times"]))],
        "step_times_note": "taken with the profiler on; use torch_ref.train.RunResult.step_times for speed",
        "notes": notes,
    }
    if any(c != per_rank_comm[0] for c in per_rank_comm[1:]):
        out["comm_per_rank"] = per_rank_comm
    return out


def dist_backend(cfg) -> str:
    from .. import launch

    return launch.backend_for(launch.rank_device(cfg.platform, 0))


def measure(cfg, init: dict, steps: int = 2, warmup: int = 1, timeout_s: float = 600.0) -> dict:
    """Launch cfg.devices ranks from the initial parameters `init` (Flax-named arrays, the JAX side's:
    `jaxdp.models.initial_arrays`), run `warmup` steps and then `steps` steps of cfg's strategy under the
    profiler (only those are counted), and return
    {comm: {kind: bytes sent per device per step, total}, comm_ops: {kind: ops per step},
     comm_requested: {c10d op: count}, memory: {params, grads, opt_state, master_params} (rank 0),
     memory_per_rank: [...], step_times: [s per step, the slowest rank's, profiler on: `step_times_note`],
     notes: [...],
     comm_per_rank: [...] only where ranks differ}."""
    from .. import launch

    cfg = cfg.validate("torch")
    views = launch.launch(
        measure_rank, cfg.devices, cfg, init, steps, warmup, platform=cfg.platform, timeout_s=timeout_s
    )
    return summarise(cfg, views)
