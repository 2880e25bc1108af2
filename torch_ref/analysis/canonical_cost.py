"""What `reduction="canonical"` costs against `native` in torch_ref (issue 40): step time and temporaries,
side by side in one world.

`measure_canonical_cost(configs, sizes)` starts one world of N ranks per N (`launch.launch`; N = 1 too:
ddp and zero3 need a process group). In each rank, for each configuration, the same model is built twice
(the same initial values) and parallelized once per mode; after `warmup` steps of each, the two steps are
called in turn (interleaved: load from elsewhere on the machine falls on both alike) `repeats` times, with
`torch.set_num_threads(threads)` in both (canonical runs one thread: `canonical.one_thread`; native as
users run it would take the rank's cores, which makes the ratio the machine's, not the method's). The
statistic: each rank's median step time, the slowest rank's; the ratio canonical / native. Temporaries:
one more step of each mode under the profiler (`profile_memory`), the most its allocations rose above
what was held at its start (`accounting.peak_rise`), rank 0's.

Also runnable alone: `python -m torch_ref.analysis.canonical_cost --model mlp --devices 1 2 4` prints one
row per strategy and N (docs/CANONICAL.md, torch section, has the table it gave).
"""
from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from jaxdp.core.registry import strategies as registry
from jaxdp.core.run import data
from jaxdp.core.run.config import ConfigError, RunConfig
from jaxdp.core.run.reduction import resolve_shards

STRATEGIES = registry.names("torch", twin="", grid=False)  # torch_ref's own strategies on one 1-D group
# The bench's models (jaxdp/harness/bench/plan.py's item 9 and the issue's): mlp, gpt, gpt2, cnn with sync BatchNorm
MODELS = {
    "mlp": RunConfig(model="mlp", data="synthetic", hidden=(1024, 1024), batch_size=512),
    "gpt": RunConfig(model="gpt", data="text", n_layer=2, n_head=4, d_model=128, seq_len=64, batch_size=32),
    "gpt2": RunConfig(model="gpt2", data="tokens", n_layer=2, n_head=4, d_model=128, seq_len=64, batch_size=32),
    "cnn": RunConfig(model="cnn", data="digits", channels=(8, 16), batchnorm="sync", batch_size=64),
}


def _parallelized(cfg: RunConfig, dataset, device):
    """cfg's model (seeded: the same values for both modes), parallelized as cfg says."""
    from .. import models, train
    from ..models import cnn

    torch.manual_seed(cfg.seed)
    module = cnn.for_device(models.build(cfg, dataset).to(device), device)
    return train.strategy(module, cfg)


def _batch(cfg: RunConfig, dataset, rank: int, n: int, device):
    from .. import models

    x, y = dataset.batch(1, cfg.batch_size)
    x = x.astype(models.numpy_master_dtype(cfg.dtype)) if np.issubdtype(x.dtype, np.floating) else x.astype(np.int64)
    x, y = (data.part_rows(a, rank, n, cfg.accum) for a in (x, y))
    return torch.from_numpy(x).to(device), torch.from_numpy(y.astype(np.int64)).to(device)


def _peak(step, x, y) -> int:
    """The most one step's allocations rose above what was held at its start (CPU, profiler events)."""
    from torch.profiler import ProfilerActivity

    from .accounting import peak_rise
    from .profiler import profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(x, y)
    return peak_rise(prof)


def compare_rank(rank: int, n: int, cfg: RunConfig, repeats: int, warmup: int, threads: int) -> dict:
    """This rank's medians and temporaries of `cfg` (native, whatever cfg.reduction says) against canonical."""
    from .. import launch

    torch.set_num_threads(threads)
    device = launch.rank_device(cfg.platform, rank)
    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    cfg = cfg.replace(devices=n)
    steps = [_parallelized(cfg.replace(reduction=m, shards=cfg.shards if m == "canonical" else 0), dataset, device).step
             for m in ("native", "canonical")]
    x, y = _batch(cfg, dataset, rank, n, device)
    times = [[], []]
    for i in range(warmup + repeats):
        for step, t in zip(steps, times, strict=True):
            t0 = time.perf_counter()
            step(x, y)
            if i >= warmup:
                t.append(time.perf_counter() - t0)
    return {"step_s": [statistics.median(t) for t in times], "temp_bytes": [_peak(s, x, y) for s in steps]}


def compare_world(rank: int, n: int, cfgs: list, repeats: int, warmup: int, threads: int) -> list[dict]:
    """`compare_rank` of every configuration, in order, in this world."""
    if rank == 0:
        print(f"canonical cost: N={n}: {len(cfgs)} configurations", flush=True)
    return [compare_rank(rank, n, c, repeats, warmup, threads) for c in cfgs]


def row(cfg: RunConfig, n: int, views: list[dict]) -> dict:
    """One configuration at N from every rank's view: the slowest rank's medians, rank 0's temporaries."""
    native, canonical = (max(v["step_s"][m] for v in views) for m in (0, 1))
    temp = views[0]["temp_bytes"]
    micro = cfg.batch_size // cfg.accum
    return {"model": cfg.model, "strategy": cfg.strategy, "devices": n,
            "shards": resolve_shards(cfg.shards or None, micro, n, cfg.tokens_per_row()), "native_step_s": native,
            "canonical_step_s": canonical, "ratio": canonical / native, "native_temp_bytes": temp[0],
            "canonical_temp_bytes": temp[1], "temp_ratio": temp[1] / max(temp[0], 1)}


def measure_canonical_cost(cfgs: list[RunConfig], sizes=(1, 2, 4), repeats: int = 5, warmup: int = 2,
                           threads: int = 1, timeout_s: float = 3600.0) -> list[dict]:
    """Canonical against native for every configuration (its strategy; `single` at N = 1 only) and N in
    `sizes`: one row each, {model, strategy, devices, shards, native_step_s, canonical_step_s, ratio,
    native_temp_bytes, canonical_temp_bytes, temp_ratio}. One world per N."""
    from .. import launch

    rows = []
    for n in sizes:
        here = [c.replace(devices=n, reduction="canonical").validate("torch") for c in cfgs
                if n == 1 or not registry.on_one_device(c.strategy)]
        if not here:
            continue
        views = launch.launch(compare_world, n, here, repeats, warmup, threads, platform="cpu", timeout_s=timeout_s)
        rows += [row(c, n, [v[i] for v in views]) for i, c in enumerate(here)]
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| model | strategy | N | S | native ms | canonical ms | ratio | temp native MiB | temp canonical MiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['strategy']} | {r['devices']} | {r['shards']} | {1e3 * r['native_step_s']:.1f} | "
              f"{1e3 * r['canonical_step_s']:.1f} | {r['ratio']:.2f}x | {r['native_temp_bytes'] / 2**20:.1f} | "
              f"{r['canonical_temp_bytes'] / 2**20:.1f} |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m torch_ref.analysis.canonical_cost",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
    parser.add_argument("--devices", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--shards", type=int, default=0, help="S (0: the default for the batch)")
    parser.add_argument("--batch-size", type=int, default=0, help="the global batch (0: the bench model's)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    base = MODELS[args.model].replace(shards=args.shards)
    base = base.replace(batch_size=args.batch_size) if args.batch_size else base
    cfgs = [base.replace(strategy=s) for s in args.strategies]
    try:  # every (configuration, N) before any world starts: bad input is one line naming the fix
        for cfg in cfgs:
            for n in args.devices:
                if n > 1 and registry.on_one_device(cfg.strategy):
                    continue  # measured at N = 1 only
                cfg.replace(devices=n, reduction="canonical").validate("torch")
    except ConfigError as err:
        parser.error(str(err))
    print(table(measure_canonical_cost(cfgs, args.devices, args.repeats)))


if __name__ == "__main__":
    main()
