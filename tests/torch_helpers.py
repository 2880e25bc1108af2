"""Shared machinery of the torch_ref tests: one spawned torch world per world size (1, 2, 3, 4)
runs the jobs of that size the selected tests need (tests/torch_jobs.py), once per session; `single`
references run in the pytest process. Nothing here asserts: the test modules do.
"""
from __future__ import annotations

import atexit
import collections
import functools
import os
import shutil
import tempfile

import numpy as np
import torch
import torch.distributed as dist

from jaxdp.core.registry import strategies as registry
from jaxdp.core.run import data
from jaxdp.core.run.config import JIT_STRATEGIES, RunConfig
from jaxdp.core.traces import trace

from . import torch_api_ranks, torch_bn_ranks, torch_jobs, torch_reduce_ranks
from .pairwise import pairwise

# The JAX suite's problem (tests/conftest.py BASE) with a bucket small enough for several buckets.
BASE = RunConfig(model="mlp", data="synthetic", hidden=(16, 16), steps=4, batch_size=72, lr=0.05,
                 weight_decay=0.01, dtype="float64", seed=3, bucket_mb=0.002)
# hsdp (zero3 on an R x S grid) has its own cases (HSDP below), not the pairwise sets: --replicas 1 is zero3
DISTRIBUTED = [s for s in registry.names("torch", oracle="single") if s not in ("single", "hsdp", *JIT_STRATEGIES)]
DIMENSIONS = {
    "strategy": DISTRIBUTED,
    "devices": [1, 2, 3, 4],
    "optimizer": ["sgd", "momentum", "adam", "adamw"],
    "accum": [1, 3],
    "clip_norm": [0.0, 0.5],
}
CASES = [BASE.replace(**case) for case in pairwise(DIMENSIONS)]
GPT = BASE.replace(model="gpt", data="text", devices=2, steps=2, batch_size=8, accum=2, n_layer=1, d_model=16,
                   n_head=2, seq_len=8, optimizer="adamw", lr=1e-2, clip_norm=1.0, bucket_mb=0.005)
GPT_CASES = [GPT.replace(strategy=s) for s in DISTRIBUTED]
# GPT-2 (tests/jaxdp/models/test_gpt2.py): strategies of both frameworks x N x accum, pairwise; momentum SGD
# (why: there).
GPT2_SMALL = BASE.replace(model="gpt2", data="text", steps=2, batch_size=36, n_layer=1, n_head=2, d_model=8,
                          seq_len=8, optimizer="momentum", lr=0.05, strategy="single", devices=1)
GPT2_DIMENSIONS = {"strategy": [s for s in registry.names(oracle="single")
                                if s not in ("single", "hsdp", *JIT_STRATEGIES)],
                   "devices": [1, 2, 3, 4], "accum": [1, 3]}
GPT2_CASES = [GPT2_SMALL.replace(**case) for case in pairwise(GPT2_DIMENSIONS)]
FLOAT32 = BASE.replace(strategy="ddp-ring", devices=4, dtype="float32", optimizer="adam", lr=1e-3)
BF16 = [BASE.replace(strategy=s, devices=2, dtype=d, optimizer="adam", lr=1e-3)
        for s in ("ddp", "zero3") for d in ("bfloat16", "float32")]
# zero3 with FSDP2's reshard_after_forward=False, under accumulation and clipping.
KEEP_GATHERED = BASE.replace(strategy="zero3", devices=2, accum=3, clip_norm=0.5, optimizer="adam",
                             reshard_after_forward=False)
# `--model cnn` (tests/jaxdp/models/test_cnn.py): pairwise over the strategies x N x accum x batchnorm, in JAX's
# names; the torch side runs each case under the same name, but JAX's ddp-pmap as its own ddp-naive (the other
# framework-only strategy, the same algorithm): 32 cases cover every strategy of both frameworks.
CNN = BASE.replace(model="cnn", data="digits", channels=(4, 4), steps=2, batch_size=36, optimizer="adamw", lr=0.01,
                   bucket_mb=0.0005)
CNN_DIMENSIONS = {
    "strategy": [s for s in registry.names("jax", oracle="single") if s not in ("single", "hsdp", *JIT_STRATEGIES)],
    "devices": [1, 2, 3, 4],
    "accum": [1, 3],
    "batchnorm": ["sync", "local"],
}
CNN_CASES = [CNN.replace(**case) for case in pairwise(CNN_DIMENSIONS)]


def cnn_torch(cfg: RunConfig) -> RunConfig:
    """A CNN case as the torch side runs it (ddp-pmap -> ddp-naive)."""
    return cfg.replace(strategy="ddp-naive") if cfg.strategy == "ddp-pmap" else cfg


CNN_TORCH = [cnn_torch(c) for c in CNN_CASES]
# hsdp on the world of 4 (tests/torch_ref/strategies/test_torch_strategies.py): R x S = 2x2, 1x4, 4x1,
# accumulation and clipping;
# the 2x2 one also runs in jaxdp: the two frameworks meet on it.
HSDP = [BASE.replace(strategy="hsdp", devices=4, replicas=r, accum=3, clip_norm=0.5, optimizer=o,
                     reshard_after_forward=k)
        for r, o, k in ((2, "adamw", True), (1, "adam", False), (4, "momentum", True))]
HSDP_COMM = [BASE.replace(strategy=s, devices=4, replicas=r) for s, r in (("hsdp", 2), ("zero3", 1))]  # collectives
HSDP_BYTES = BASE.replace(strategy="hsdp", devices=4, replicas=2, optimizer="adam", clip_norm=0.5)  # bytes by group
# --kernels fused (torch_ref/kernels.py) at N = 2, judged against mirrored `single`: SDPA, fused AdamW, bf16 weights
# cast once (ddp) or by FSDP2's MixedPrecisionPolicy (zero3)
FUSED = [GPT2_SMALL.replace(strategy=s, devices=2, dtype=d, kernels="fused", optimizer="adamw", lr=1e-3, steps=3)
         for s in ("ddp", "zero3") for d in ("bfloat16", "float32")]
TRAIN = CASES + GPT_CASES + [FLOAT32] + BF16 + [KEEP_GATHERED] + CNN_TORCH + HSDP + FUSED
TRAIN += [c for c in GPT2_CASES if c.strategy in DISTRIBUTED]
RING_SIZES = [1, 2, 3, 5, 7, 12, 13, 100]
API_SIZES = (1, 2, 3)  # the world sizes tests/torch_ref/test_torch_api.py's cases need


# ---- in the pytest process ----------------------------------------------------------------------
@functools.cache
def init_for(cfg: RunConfig) -> dict:
    """The JAX initial parameters (depend only on the model, the data and the seed)."""
    from jaxdp import models

    return models.initial_arrays(cfg, data.load(cfg.data, cfg.seed, cfg.seq_len))


def init_key(cfg: RunConfig) -> RunConfig:
    return RunConfig(model=cfg.model, data=cfg.data, dtype=cfg.dtype, seed=cfg.seed, hidden=cfg.hidden,
                     n_layer=cfg.n_layer, n_head=cfg.n_head, d_model=cfg.d_model, seq_len=cfg.seq_len,
                     channels=cfg.channels, n_kv_head=cfg.n_kv_head, d_ff=cfg.d_ff)  # llama's shapes too


@functools.cache
def single(cfg: RunConfig):
    """torch `single` on `cfg`'s problem, in this process."""
    from torch_ref.train import train_rank

    cfg = cfg.replace(strategy="single", devices=1)
    return train_rank(0, 1, cfg, init_for(init_key(cfg)), record=True, device=torch.device("cpu"))


@functools.cache
def world(n: int) -> torch_jobs.Results:
    """Spawn a world of n ranks once; it runs the jobs of size n the selected tests need (tests/torch_jobs.py).
    Returns {RunConfig or job name: result}."""
    from torch_ref.launch import launch

    jobs = [("train", cfg, init_for(init_key(cfg))) for cfg in train_configs(n)]
    folder = tempfile.mkdtemp(prefix="torch_api_")
    atexit.register(shutil.rmtree, folder, True)  # the session's, not the machine's
    api_trace = os.path.join(folder, f"api-{n}.npz")
    jobs += [job for job in other_jobs(n, api_trace) if torch_jobs.wanted((job[0], n))]
    if not jobs:
        return torch_jobs.Results(n, {})
    per_rank = launch(run_jobs, n, jobs, timeout_s=600, pg_timeout_s=120)
    out = {}
    for i, job in enumerate(jobs):
        key = job[1] if job[0] == "train" else job[0]
        out[key] = per_rank[0][i] if job[0] == "train" else [r[i] for r in per_rank]
    out["api_trace"] = api_trace
    return torch_jobs.Results(n, out)


def train_configs(n: int) -> list[RunConfig]:
    """The training runs of world n: TRAIN's, or only those the selected tests need (and any they add)."""
    needed = TRAIN if torch_jobs.NEEDED is None else torch_jobs.NEEDED
    return [cfg for cfg in dict.fromkeys(needed) if isinstance(cfg, RunConfig) and cfg.devices == n]


def other_jobs(n: int, api_trace: str) -> list[tuple]:
    """World n's jobs other than training runs, each `(name, *arguments)`."""
    jobs = [("ring", RING_SIZES)]
    if n in (2, 4):  # tests/torch_ref/canonical/test_torch_reduce.py
        jobs.append(("canonical_reduce",))
    if n in API_SIZES:  # tests/torch_ref/test_torch_api.py: its model through the library API
        jobs.append(("api", api_trace))
    if n == 4:  # hsdp 2 x 2 against zero3 (tests/torch_ref/strategies/test_torch_strategies.py)
        jobs.append(("hsdp_comm", HSDP_COMM, init_for(init_key(BASE))))
        jobs.append(("hsdp_bytes", HSDP_BYTES, init_for(init_key(BASE))))
    if n == 2:
        jobs.append(("comm", BASE.replace(devices=2), init_for(init_key(BASE))))
        jobs.append(("buckets", BASE.replace(strategy="ddp-bucket", devices=2, accum=3), init_for(init_key(BASE))))
        jobs.append(("keep_gathered", KEEP_GATHERED.replace(accum=1), init_for(init_key(BASE))))
        jobs.append(("gpt2_comm", GPT2_SMALL.replace(strategy="zero3", devices=2), init_for(init_key(GPT2_SMALL))))
        jobs.append(("bn",))  # tests/torch_ref/test_torch_batchnorm.py: a user's conv net, converted and plain
    return jobs


def result(cfg: RunConfig):
    return world(cfg.devices)[cfg]


def as_trace(res) -> trace.Trace:
    return trace.Trace(res.meta, res.arrays)


# ---- in the spawned ranks -----------------------------------------------------------------------
def train_jobs(rank: int, n: int, jobs: list) -> list:
    """Each job (cfg, init, record) trained in turn: rank 0's RunResults in order (None elsewhere). A rank runs it
    from here, not from a test module, which would import that module's imports (JAX) in every rank."""
    from torch_ref.train import train_rank

    return [train_rank(rank, n, cfg, init, record) for cfg, init, record in jobs]


def loaded(rank: int, n: int, names: list) -> dict:
    """{module: already imported} in a rank as it starts (tests/torch_ref/test_torch_launch.py)."""
    import sys

    return {name: name in sys.modules for name in names}


def run_jobs(rank: int, n: int, jobs: list) -> list:
    from torch_ref.train import train_rank

    out = []
    for job in jobs:
        if job[0] == "train":
            out.append(train_rank(rank, n, job[1], job[2], record=True))
        elif job[0] == "ring":
            out.append(ring_errors(rank, n, job[1]))
        elif job[0] == "canonical_reduce":
            out.append(torch_reduce_ranks.run(rank, n))
        elif job[0] == "api":
            out.append(torch_api_ranks.run_cases(rank, n, job[1]))
        elif job[0] == "comm":
            out.append({s: {accum: collectives_per_step(rank, n, job[1].replace(strategy=s, accum=accum), job[2])
                            for accum in (1, 3)} for s in DISTRIBUTED})
        elif job[0] == "buckets":
            out.append(bucket_launches(rank, n, job[1], job[2]))
        elif job[0] == "hsdp_comm":
            out.append([collectives_per_step(rank, n, cfg, job[2]) for cfg in job[1]])
        elif job[0] == "hsdp_bytes":
            from torch_ref.analysis import accounting

            out.append(accounting.measure_rank(rank, n, job[1], job[2], steps=1, warmup=1))
        elif job[0] in ("keep_gathered", "gpt2_comm"):
            out.append(collectives_per_step(rank, n, job[1], job[2]))
        elif job[0] == "bn":
            out.append(torch_bn_ranks.run_cases(rank, n))
    return out


def ring_errors(rank: int, n: int, sizes) -> dict:
    """Worst |ring - built-in| relative to the built-in's scale, per collective and size."""
    from torch_ref import collectives
    from torch_ref.strategies.zero.zero2 import all_gather, reduce_scatter  # the built-ins, as zero2 calls them

    def rel(a, b):
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))
    errors = {}
    for size in sizes:
        x = torch.from_numpy(np.random.default_rng([rank, size]).standard_normal(size))
        ref = x.clone()
        dist.all_reduce(ref)
        errors[("all_reduce", size)] = rel(collectives.ring_all_reduce(x), ref)
        shard = reduce_scatter(collectives.pad_to_multiple(x, n))
        errors[("reduce_scatter", size)] = rel(collectives.ring_reduce_scatter(x), shard)
        errors[("all_gather", size)] = rel(collectives.ring_all_gather(x), all_gather(x))
        errors[("shapes", size)] = (tuple(collectives.ring_all_reduce(x.reshape(1, -1)).shape) == (1, size))
        errors[("root_tree", size)] = root_tree_exact(x, n)
    return errors


def root_tree_exact(x: torch.Tensor, n: int) -> bool:
    """`reduce_to_root` on rank 0 is bitwise the canonical tree over the ranks' values (N a power of two),
    or the left fold ((x0 + x1) + x2) at N = 3; the other ranks get None."""
    from torch_ref import collectives
    from torch_ref.canonical.reduce import tree

    rows = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(rows, x)
    got = collectives.reduce_to_root(x.clone())
    if dist.get_rank() != 0:
        return got is None
    want = tree(torch.stack(rows)) if n & (n - 1) == 0 else (rows[0] + rows[1]) + rows[2]
    return bool(torch.equal(got, want))


def _strategy_and_batch(rank, n, cfg, init):
    from torch_ref import models, train

    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    model = models.load_flax(models.build(cfg, dataset), init)
    strategy = train.strategy(model, cfg)
    x, y = dataset.batch(1, cfg.batch_size)
    rows = slice(rank * cfg.batch_size // n, (rank + 1) * cfg.batch_size // n)
    return strategy, torch.from_numpy(x[rows]), torch.from_numpy(y[rows].astype(np.int64))


def collectives_per_step(rank, n, cfg, init) -> dict:
    """The c10d collectives one optimizer step issues, by profiler event name (second step)."""
    from torch.profiler import ProfilerActivity

    from torch_ref.analysis.profiler import profile

    strategy, x, y = _strategy_and_batch(rank, n, cfg, init)
    strategy.step(x, y)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        strategy.step(x, y)
    return dict(collections.Counter(e.name for e in prof.events() if e.name.startswith(("c10d::", "gloo:"))))


def bucket_launches(rank, n, cfg, init) -> dict:
    """Each bucket's launches over two steps, its elements, and in the second step: the element
    count of every all-reduce the strategy launched (`dist.all_reduce` calls, in order) and of every
    one the process group ran (`gloo:all_reduce` profiler events, by start time: gloo runs them on
    two worker threads, so two buckets in flight at once may start in either order)."""
    from torch.profiler import ProfilerActivity

    from torch_ref.analysis.profiler import profile

    strategy, x, y = _strategy_and_batch(rank, n, cfg, init)
    strategy.step(x, y)
    launched, all_reduce = [], dist.all_reduce

    def spy(tensor, *args, **kwargs):
        launched.append(tensor.numel())
        return all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = spy
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            strategy.step(x, y)
    finally:
        dist.all_reduce = all_reduce
    ran = sorted((e for e in prof.events() if e.name == "gloo:all_reduce"), key=lambda e: e.time_range.start)
    buckets = strategy.wrapped.buckets
    return {"launches": [b.launches for b in buckets], "sizes": [len(b.params) for b in buckets],
            "elements": [b.grad_data.numel() for b in buckets], "launched": launched,
            "all_reduces": [int(np.prod(e.input_shapes[0])) if e.input_shapes else None for e in ran]}


class world_of_one:
    """A gloo process group of one rank in this process, for the duration (none may exist already)."""

    def __enter__(self):
        assert not dist.is_initialized()
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    def __exit__(self, *_):
        dist.destroy_process_group()
