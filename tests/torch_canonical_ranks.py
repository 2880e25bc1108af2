"""The rank side of tests/torch_ref/canonical/test_torch_canonical.py: a small float32 model trained through the
library API (`parallelize(..., reduction=...)`, `train_step`, `trace.Recorder`) for a list of cases, in one world
per size. Nothing here asserts: the test module does."""
from __future__ import annotations

import functools
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import torch_ref
from jaxdp.core.run import data
from torch_ref import launch
from torch_ref.canonical import reduce as C
from torch_ref.models.cnn import CNN
from torch_ref.trace import Recorder

FEATURES, HIDDEN, CLASSES, ROWS, STEPS, SHARDS = 8, 32, 4, 16, 2, 4  # ROWS per micro-batch: 4 shards of 4
OPTIMIZERS = {"momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
              "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1)}


class Net(nn.Module):
    """Linear -> LayerNorm -> tanh -> Linear."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(FEATURES, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)
        self.out = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        return self.out(torch.tanh(self.norm(self.inp(x))))


def fresh_net() -> Net:
    torch.manual_seed(11)
    net = Net()
    with torch.no_grad():
        net.norm.weight.add_(torch.linspace(-0.3, 0.3, HIDDEN))
        net.norm.bias.add_(0.1)
    return net


def batch(k: int, accum: int, model: str = "mlp"):
    if model.startswith("cnn"):  # `--model cnn --data digits`; "cnn64": float64
        x, y = digits().batch(k, ROWS * accum)
        return x.astype(np.float64 if model == "cnn64" else np.float32), y.astype(np.int64)
    rng = np.random.default_rng(100 + k)
    x = rng.standard_normal((ROWS * accum, FEATURES)).astype(np.float32) * 3
    return x, rng.integers(0, CLASSES, ROWS * accum)


@functools.cache
def digits():
    return data.load("digits", 0)


def fresh_cnn(batchnorm: str = "sync", dtype=torch.float32) -> CNN:
    """The torch cnn (channels 4, 4; two sync BatchNorms) with non-trivial BatchNorm scales and biases."""
    torch.manual_seed(11)
    net = CNN((4, 4), 10, batchnorm).to(dtype)
    with torch.no_grad():
        for bn in (net.bn1, net.bn2):
            bn.weight.add_(torch.linspace(-0.3, 0.3, 4, dtype=dtype))
            bn.bias.add_(0.1)
    return net


def my_rows(a: np.ndarray, rank: int, n: int, accum: int) -> np.ndarray:
    """This rank's rows: its block of every micro-batch (jaxdp.core.run.data.part_rows' layout)."""
    return np.concatenate([m[rank * len(m) // n:(rank + 1) * len(m) // n] for m in np.split(a, accum)])


def parallelized(strategy: str, accum: int, optimizer: str, reduction: str, shards, model: str = "mlp"):
    extra = {"reduction": "canonical", "shards": shards} if reduction != "native" else {}
    strategy, _, replicas = strategy.partition(":")  # "hsdp:R": R replicas
    if replicas:
        extra["replicas"] = int(replicas)
    if strategy in ("ddp", "zero1", "ddp-bucket"):
        extra["bucket_mb"] = 0.001 if model == "mlp" else 0.0005  # a few buckets of these small models
    net = fresh_net() if model == "mlp" else fresh_cnn(dtype=torch.float64 if model == "cnn64" else torch.float32)
    return torch_ref.parallelize(net, strategy=strategy, optimizer=OPTIMIZERS[optimizer], accum=accum, **extra)


def fold(rows: torch.Tensor) -> torch.Tensor:
    """A wrong tree (the mutation): ((r0 + r1) + r2) + ..., a left fold over the ranks' partial sums."""
    total = rows[0]
    for r in rows[1:]:
        total = total + r
    return total


def fold_(rows: torch.Tensor) -> torch.Tensor:
    """`fold` added within `rows`, as `tree_` adds the tree (the same mutation on the in-place path)."""
    for r in rows[1:]:
        rows[0].add_(r)
    return rows[0]


def train_case(rank: int, n: int, case: tuple) -> dict:
    """case = (strategy, n, accum, optimizer, clip_norm, reduction, shards[, "cnn"]); reduction 'canonical-fold'
    is canonical with the tree across ranks replaced by `fold` (and `fold_`). Rank 0's trace arrays (loss, grads,
    params, buffers: the cnn's BatchNorm running statistics)."""
    strategy, _, accum, optimizer, clip_norm, reduction, shards, *net = case
    net = net[0] if net else "mlp"
    model, opt = parallelized(strategy, accum, optimizer, reduction, shards, net)
    mutated = reduction == "canonical-fold"
    (tree, C.tree), (tree_, C.tree_) = (C.tree, fold if mutated else C.tree), (C.tree_, fold_ if mutated else C.tree_)
    try:
        with Recorder(None, {"strategy": strategy, "devices": n}, model) as rec:
            rec.init()
            for k in range(1, STEPS + 1):
                x, y = batch(k, accum, net)
                xs, ys = (torch.from_numpy(my_rows(a, rank, n, accum)) for a in (x, y))
                loss = torch_ref.train_step(model, opt, xs, ys, F.cross_entropy, clip_norm=clip_norm)
                rec.step(k, loss)
    finally:
        C.tree, C.tree_ = tree, tree_
    return rec.arrays


def run_cases(rank: int, n: int, cases: list, checkpoints: str) -> dict:
    """Every case on this world; rank 0 returns {case: arrays}, at N = 2 the refused settings' messages
    (every rank must raise, none may hang), and `resumed`: zero2 saves step 1 at N = 2, resumes at N = 4."""
    out = {case: train_case(rank, n, case) for case in cases}
    if n == 2:
        out["errors"] = errors(rank, n)
        out["gathers"] = gathers(rank, n)
    out["resumed"] = resumed(rank, n, checkpoints, RESUMED) if n in (2, 4) else None
    return out if rank == 0 else {}


def run_worlds(rank: int, n: int, plan: dict, checkpoints: str) -> dict | None:
    """One spawn of n = max(plan) processes serves every world size in `plan` ({size: cases}), smallest
    first: the launcher's group is replaced by one group per size over its first `size` ranks (a
    FileStore in `checkpoints`; the other ranks go on to the next one and wait there). Returns rank 0's
    {size: run_cases' result}."""
    out = {}
    dist.destroy_process_group()
    for size in sorted(plan):
        if rank < size:
            store = dist.FileStore(os.path.join(checkpoints, f"world-{size}"), size)
            launch.init_process_group(torch.device("cpu"), rank, size, 240, store=store)
            out[size] = run_cases(rank, size, plan[size], checkpoints)
            if size < n:
                dist.destroy_process_group()
    return out if rank == 0 else None


RESUMED = ("zero2", None, 3, "adamw", 0.5, "canonical", SHARDS)


def resumed(rank: int, n: int, directory: str, case: tuple) -> dict:
    """`case` trained for step 1 and checkpointed at N = 2 (torch_ref.checkpoint, DCP), resumed at N = 4
    for the steps after: rank 0's arrays of those steps."""
    from jaxdp.core.run.config import RunConfig
    from torch_ref import api, checkpoint

    strategy, _, accum, optimizer, clip_norm, _, shards = case
    cfg = RunConfig(strategy=strategy, devices=n, optimizer=optimizer, accum=accum, clip_norm=clip_norm, steps=STEPS,
                    batch_size=ROWS * accum, dtype="float32", reduction="canonical", shards=shards)
    model, opt = parallelized(strategy, accum, optimizer, "canonical", shards)
    state = api.state_of(model).checkpoint
    start = checkpoint.restore(directory, state, cfg) if n == 4 else 0
    with Recorder(None, {"strategy": strategy, "devices": n}, model) as rec:
        for k in range(start + 1, (STEPS if n == 4 else 1) + 1):
            x, y = batch(k, accum)
            xs, ys = (torch.from_numpy(my_rows(a, rank, n, accum)) for a in (x, y))
            rec.step(k, torch_ref.train_step(model, opt, xs, ys, F.cross_entropy, clip_norm=clip_norm))
    if n == 2:
        checkpoint.save(directory, 1, state, cfg)
    return rec.arrays


REFUSED = [(3, ROWS), (1, ROWS), (8, 12)]  # (shards, rows per micro-batch) that canonical refuses at N = 2


def gathers(rank: int, n: int) -> dict:
    """zero3's parameter all-gathers in one step (FSDP2's `FSDP::all_gather (unit)` events; Net has 3 units,
    each sharded on its own), native and canonical (S = 4: 2 shards per rank at N = 2), FSDP2's own gradient
    reductions (`FSDP::post_backward_reduce` events: canonical with several shards runs none, `zero3.held_gathered`),
    and whether any unit is left gathered after the step."""
    from torch.distributed.fsdp import FSDPModule
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for reduction in ("native", "canonical"):
        model, opt = parallelized("zero3", 1, "adamw", reduction, SHARDS)
        xs, ys = (torch.from_numpy(my_rows(a, rank, n, 1)) for a in batch(1, 1))
        torch_ref.train_step(model, opt, xs, ys, F.cross_entropy)  # FSDP2's lazy initialisation
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            torch_ref.train_step(model, opt, xs, ys, F.cross_entropy)
        out[reduction] = sum(e.name.startswith("FSDP::all_gather (") for e in prof.events())
        out[f"{reduction} reduces"] = sum(e.name.startswith("FSDP::post_backward_reduce") for e in prof.events())
        out[f"{reduction} left gathered"] = any(g.is_unsharded for m in model.modules() if isinstance(m, FSDPModule)
                                                for g in m._get_fsdp_state()._fsdp_param_groups)
    return out


def errors(rank: int, n: int) -> list[str]:
    messages = []
    for shards, rows in REFUSED:
        model, opt = parallelized("ddp", 1, "momentum", "canonical", shards)
        x, y = (a[rank * rows // n:(rank + 1) * rows // n] for a in batch(1, 1))
        try:
            torch_ref.train_step(model, opt, torch.from_numpy(x), torch.from_numpy(y), F.cross_entropy)
            messages.append("no error")
        except ValueError as e:
            messages.append(str(e))
    dist.barrier()
    return messages
