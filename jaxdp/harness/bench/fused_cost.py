"""Item 13: what the fused path costs on this CPU against the mirrored one (`--kernels`, docs/KERNELS.md), per
framework, as one ratio per row: fused / mirrored step time, gpt2 (the bench's small one) in float32 and
bf16, `single` on 1 device and `ddp` on 2.

JAX: both steps compiled from the same configuration in the bench's process (`accounting.compile_step`),
called in turn (interleaved, as items 9 and 11: load from elsewhere on the machine falls on both alike),
the loss read each step; the statistic is the median. torch: one world of N ranks per N (`launch.launch`, N = 1
too), in each rank both models built from the same values (`canonical_cost`'s builders), parallelized once
per path and called in turn the same way, with `cores // N` intra-op threads (the ranks share the cores);
the slowest rank's median. torch runs eager, or both its paths under torch.compile with the bench's `--compile`:
every row says which.
Also runnable alone: `python -m jaxdp.harness.bench.fused_cost [--quick] --out DIR` (fused_cost.json and
fused_cost.md, the section bench.md carries)."""
from __future__ import annotations

import os
import statistics

from ...core.run.kernels import KERNELS
from .nan_check import WARMUP_CALLS, in_turn
from .plan import Plan
from .tables import ratio

TIMEOUT_S = 900.0  # one torch world: every row of its N


def jax_medians(cfg, repeats: int) -> list[float]:
    """Median seconds of `cfg`'s step on each path (KERNELS' order), compiled here and called in turn."""
    from .nan_check import jax_call

    calls = [jax_call(cfg.replace(kernels=k).validate("jax")) for k in KERNELS]
    return in_turn(calls, repeats, statistic=statistics.median)


def torch_world(rank: int, n: int, cfgs: list, repeats: int, threads: int) -> list[list[float]]:
    """In each torch rank: for each configuration, its median seconds per path (KERNELS' order)."""
    import torch

    from jaxdp.core.run import data
    from torch_ref import launch
    from torch_ref.analysis.canonical_cost import _batch, _parallelized

    torch.set_num_threads(threads)
    device = launch.rank_device("cpu", rank)
    out = []
    for cfg in cfgs:
        dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
        steps = [_parallelized(cfg.replace(kernels=k), dataset, device).step for k in KERNELS]
        x, y = _batch(cfg, dataset, rank, n, device)
        out.append(in_turn([lambda s=s, x=x, y=y: s(x, y) for s in steps], repeats, statistic=statistics.median))
    return out


def torch_medians(cfgs: list, n: int, repeats: int) -> list[list[float]]:
    """Every configuration of one N in one world: per configuration, the slowest rank's median per path."""
    from torch_ref import launch

    for c in cfgs:
        c.validate("torch")
    views = launch.launch(torch_world, n, cfgs, repeats, max(1, (os.cpu_count() or 1) // n), platform="cpu",
                          timeout_s=TIMEOUT_S, pg_timeout_s=120)
    return [[max(v[i][k] for v in views) for k in range(len(KERNELS))] for i in range(len(cfgs))]


def configs(p: Plan) -> list:
    """Item 13's configurations (kernels left to the measurement; torch.compile as the bench's `--compile`), in the
    plan's row order."""
    return [p.fused_model.replace(dtype=dtype, strategy=strategy, devices=n, compile=p.torch_compile)
            for dtype, strategy, n in p.fused_runs]


def row(cfg, framework: str, step_s: list[float]) -> dict:
    mirrored, fused = step_s
    return {"framework": framework, "model": cfg.model, "dtype": cfg.dtype, "strategy": cfg.strategy,
            "devices": cfg.devices, "paths": list(KERNELS),
            "torch_compiled": cfg.compile if framework == "torch" else None,
            "mirrored_step_s": mirrored, "fused_step_s": fused, "ratio": ratio(fused, mirrored)}


def fused_cost_benchmark(p: Plan, say) -> dict:
    """Item 13: {"rows", "setup"}: jaxdp's rows, then torch_ref's (one world per N)."""
    cfgs = configs(p)
    rows = []
    for c in cfgs:
        say(f"bench: fused vs mirrored, jaxdp {c.model} {c.dtype} {c.strategy} N={c.devices}")
        rows.append(row(c, "jax", jax_medians(c, p.fused_repeats)))
    torch_rows = {}
    for n in sorted({c.devices for c in cfgs}):
        here = [c for c in cfgs if c.devices == n]
        say(f"bench: fused vs mirrored, torch_ref N={n}: {len(here)} configurations (one world)")
        torch_rows |= {c: row(c, "torch", t) for c, t in zip(here, torch_medians(here, n, p.fused_repeats),
                                                             strict=True)}
    rows += [torch_rows[c] for c in cfgs]  # in the jaxdp rows' order
    m = p.fused_model
    return {"rows": rows, "setup": {
        "model": {f: getattr(m, f) for f in ("model", "data", "n_layer", "n_head", "d_model", "seq_len",
                                             "batch_size", "optimizer")},
        "repeats": p.fused_repeats, "warmup_calls": WARMUP_CALLS, "statistic": "median",
        "torch_threads": "cores // N per rank", "torch_compiled": p.torch_compile}}


def section(results: dict) -> list:
    """bench.md's table for item 13 (absent from results written before it)."""
    item = results.get("fused_cost")
    if not item or not item.get("rows"):
        return []
    s, m = item["setup"], item["setup"]["model"]
    lines = ["", "## 13. The fused path's CPU cost: fused / mirrored step time (`--kernels`, interleaved, median ms)",
             "", f"Model: {m['model']} n_layer {m['n_layer']}, n_head {m['n_head']}, d_model {m['d_model']}, seq_len "
             f"{m['seq_len']}, batch {m['batch_size']}, {m['optimizer']}, on {m['data']}; both paths called in turn, "
             f"{s['warmup_calls']} warm-up then the {s['statistic']} of {s['repeats']}; torch: one world per N, "
             f"{s['torch_threads']}, the slowest rank's median, "
             + ("both paths under torch.compile." if s.get("torch_compiled") else "eager (no torch.compile)."), "",
             "| framework | dtype | strategy | N | mirrored ms | fused ms | fused / mirrored |",
             "|---|---|---|---:|---:|---:|---:|"]
    for r in item["rows"]:
        name = "jaxdp" if r["framework"] == "jax" else "torch_ref (eager)" if not r["torch_compiled"] else \
            "torch_ref (compiled)"
        lines.append(f"| {name} | {r['dtype']} | {r['strategy']} | {r['devices']} | {1e3 * r['mirrored_step_s']:.1f} "
                     f"| {1e3 * r['fused_step_s']:.1f} | {'-' if r['ratio'] is None else format(r['ratio'], '.2f')} |")
    return lines


if __name__ == "__main__":
    import argparse
    import sys
    import time

    from ... import devices
    from ...core.files import atomic
    from .machine import machine
    from .plan import plan
    from .tables import jsonable

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny gpt2 and 3 repeats (a smoke run)")
    parser.add_argument("--out", default="reports/bench", help="folder for fused_cost.json and fused_cost.md")
    parser.add_argument("--compile", action="store_true", help="torch_ref's both paths under torch.compile")
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the bench (bench._passive_omp), before torch loads
    p = plan(args.quick, torch_compile=args.compile)
    devices.setup(max(n for *_, n in p.fused_runs), "cpu")
    t0 = time.perf_counter()
    result = fused_cost_benchmark(p, lambda m: print(m, file=sys.stderr, flush=True))
    result["wall_s"], result["load_average"] = time.perf_counter() - t0, os.getloadavg()
    m = result["machine"] = machine()
    head = (f"Machine: {m['cpu']}, {m['cores']} cores, {m['system']}; JAX {m['versions'].get('jax')}, torch "
            f"{m['versions'].get('torch')}; {result['wall_s']:.0f} s, load average {result['load_average'][0]:.1f}.")
    with atomic.staged(args.out) as stage:  # both files or neither
        atomic.write_json(os.path.join(stage, "fused_cost.json"), jsonable(result), indent=1)
        text = "\n".join([head] + section({"fused_cost": result})) + "\n"
        atomic.write_text(os.path.join(stage, "fused_cost.md"), text)
    print(f"wrote {os.path.join(args.out, 'fused_cost.json')} and fused_cost.md")
