"""Item 11: what the non-finite check costs (`--nan-check`, on by default; jaxdp/strategies/finite.py and
torch_ref/strategies/finite.py). JAX: for each strategy, on item 10's mlp at N = max(time_ns) (single at 1),
the step compiled with the check and without it from the same configuration, called in turn
(as item 9 does: load from elsewhere falls on both alike), the host reading the flags each step as the
train loop does; the statistic is the fastest step (`in_turn`) and the ratio with / without. torch: one rank in this
process, the same model with the optimizer's hooks and without, interleaved likewise."""
from __future__ import annotations

import time

import jax
import numpy as np

from ...analysis import accounting
from ...core.registry import strategies as registry
from .plan import Plan
from .tables import ratio

WARMUP_CALLS = 2  # as item 9's (`reduction.py`)
STRATEGIES, QUICK = registry.benched("nan-check"), registry.benched("nan-check-quick")  # the registry's rows


def in_turn(calls, repeats: int, statistic=min) -> list[float]:
    """`statistic` (default the fastest) of each of `calls`' wall seconds, called in turn after WARMUP_CALLS: the
    cost of a few reductions is far below the load other jobs put on a shared machine, which the minimum leaves
    out. Item 13 (`kernels.py`, its torch ranks too) takes the median."""
    times = [[] for _ in calls]
    for i in range(WARMUP_CALLS + repeats):
        for call, t in zip(calls, times, strict=True):
            t0 = time.perf_counter()
            call()
            if i >= WARMUP_CALLS:
                t.append(time.perf_counter() - t0)
    return [statistic(t) for t in times]


def jax_call(cfg):
    """`cfg`'s step compiled, as a call that runs one step and reads what the train loop reads (items 11, 13)."""
    c = accounting.compile_step(cfg)
    box = {"state": c.state}

    def call():
        box["state"], metrics = c.program(box["state"], *c.batch)
        float(metrics["loss"])
        if "finite" in metrics:  # as the train loop reads them (one array, or one per tensor)
            all(np.all(np.asarray(a)) for a in jax.tree.leaves(metrics["finite"]))
    return call


def _torch_call(cfg):
    import torch

    from jaxdp.core.run import data
    from torch_ref import api, models, train
    from torch_ref.strategies import finite

    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    module = models.build(cfg, dataset)
    model, optimizer = train.configured(module, cfg)
    if cfg.nan_check:
        finite.guard(optimizer, module, cfg.strategy)
    x, y = (torch.from_numpy(np.asarray(a, np.int64 if a.dtype.kind in "iu" else np.float32))
            for a in dataset.batch(1, cfg.batch_size))
    return lambda: api.train_step(model, optimizer, x, y, train.cross_entropy)


def nan_check_benchmark(p: Plan, say) -> dict:
    """Rows: framework, strategy, devices, step_s with and without the check, and their ratio."""
    model, n, repeats = p.jit_model, max(p.time_ns), max(2 * p.reduction_repeats, 5)
    rows = []
    for strategy in QUICK if p.quick else STRATEGIES:
        devices = 1 if registry.on_one_device(strategy) else n
        say(f"nan check: {strategy} at N = {devices}, with and without")
        cfgs = [model.replace(strategy=strategy, devices=devices, nan_check=c).validate("jax") for c in (True, False)]
        on, off = in_turn([jax_call(c) for c in cfgs], repeats)
        rows.append({"framework": "jax", "strategy": strategy, "devices": devices, "with_s": on, "without_s": off,
                     "ratio": ratio(on, off)})
        jax.clear_caches()
    cfgs = [model.replace(strategy=registry.ONE_DEVICE, devices=1, nan_check=c) for c in (True, False)]
    on, off = in_turn([_torch_call(c) for c in cfgs], repeats)
    rows.append({"framework": "torch", "strategy": registry.ONE_DEVICE, "devices": 1, "with_s": on, "without_s": off,
                 "ratio": ratio(on, off)})
    return {"rows": rows}


def section(results: dict) -> list:
    """bench.md's table for item 11."""
    rows = results.get("nan_check", {}).get("rows", [])
    if not rows:
        return []
    lines = ["", "## 11. The non-finite check's cost (`--nan-check` / `--no-nan-check`, interleaved, fastest ms)", "",
             "| framework | strategy | N | with ms | without ms | with / without |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['framework']} | {r['strategy']} | {r['devices']} | {1e3 * r['with_s']:.2f} | "
                     f"{1e3 * r['without_s']:.2f} | {r['ratio']:.3f} |")
    return lines
