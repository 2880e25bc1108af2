"""Bench item 12, `gpu_projection`: every strategy compiled for 8 H100s (one node) and 16 (two nodes of 8) by
XLA:GPU on this CPU machine (`--target`, docs/GPU.md), GPT-2 124M and Llama 3 8B in bf16 with fp32 master
weights and AdamW: the compiled peak and `fits`, bytes against the theory, the compute under collectives,
and a PROJECTED step time and MFU beside the published figures: the calibrated projection's range
(`analysis/calibration.py`, docs/GPU.md "Projected step time"), to the figures its range supports. Nothing runs
on a GPU: the numbers are the compiler's program and the calibrated model over it. Skipped (with the reason) without the
gpu-aot extra, and in --quick (its compiles take minutes).

`jaxdp bench` (full) compiles the headline rows only (`IN_BENCH`: Llama 3 8B's ddp and zero3 on 8 H100s, the
does-not-fit / fits pair, and GPT-2 124M's ddp on 8 beside llm.c's MFU), so that the whole bench stays within
its 25 minutes on 2 cores; `python -m jaxdp.harness.bench.gpu_target OUT.json [models]` runs every row (42
compiles: 1.5-2 minutes per GPT-2 124M compile, 2-4 per Llama 3 8B, on 2 shared cores; docs/BENCHMARKS.md).
"""
from __future__ import annotations

import sys
import time

from ...analysis import calibration
from ...core.files import atomic
from ...core.registry import strategies as registry
from ...core.run import targets
from ...core.run.config import RunConfig

STRATEGIES = registry.benched("gpu")  # the registry's rows
MODELS = {  # rows per GPU: GPT-2 124M as llm.c trains it (B 8 x 1024 tokens per GPU), Llama 3 8B 1 x 2048
    "gpt2-124m": (RunConfig(preset="gpt2-124m", dtype="bfloat16"), 8, STRATEGIES),
    "llama3-8b": (RunConfig(preset="llama3-8b", dtype="bfloat16"), 1, STRATEGIES),
}
IN_BENCH = {("llama", registry.REPLICATED, 8), ("llama", registry.FULLY_SHARDED, 8),  # (model, strategy, GPUs)
            ("gpt2", registry.REPLICATED, 8)}
PUBLISHED = ["llm.c GPT-2 124M on 8 H100: about 38% MFU (karpathy/llm.c discussions)",
             "MaxText Llama2-70B on 64 H100s, BF16, sequence 4096, global batch 128: 460.48 TFLOP/s per device "
             "(46.6% of 989) (NVIDIA DGXC Benchmarking, 'Maxtext Llama2 70B 25.01.1', NGC catalog)",
             "PyTorch FSDP2 Llama 3.1 8B: 5,762 tokens/s/GPU on 8 H100s, 5,605 on 128, 97.3% kept "
             "(pytorch/torchtitan docs/performance.md, Tables 1 and 3)"]


def _row(cfg, nodes: int) -> dict:
    from ...analysis import inspect

    t0 = time.perf_counter()
    r = inspect.inspect(cfg, target="h100", nodes=nodes)
    p = r["projection"]
    return {"model": cfg.model, "strategy": cfg.strategy, "devices": cfg.devices, "nodes": nodes,
            "peak_bytes": r["peak_bytes"], "fits": r["fits"], "bytes_per_device": r["bytes_per_device"],
            "theory_bytes_per_device": r["theory_bytes_per_device"], "difference": r["difference"],
            "overlap_flops": r["overlap_flops"], "step_flops": r["step_flops"], "prefetch": r.get("prefetch"),
            "collectives_in_loop": r["collectives_in_loop"], "projected_step_s": p["step_s"],
            "step_low_s": p["step_low_s"], "step_high_s": p["step_high_s"],
            "projected_mfu": p["mfu"], "exposed_comm_s": p["exposed_comm_s"], "comm_s": p["comm_s"],
            "wall_s": round(time.perf_counter() - t0, 1)}


def cases(names=None) -> list:
    """(config, nodes) of every row: each model's strategies on 8 GPUs (one node) and 16 (two), hsdp on two."""
    out = []
    for name in names or MODELS:
        base, rows, strategies = MODELS[name]
        for n, nodes in ((8, 1), (16, 2)):
            for s in strategies:
                grid = registry.entry(s).grid
                extra = {"replicas": 2} if grid else {}
                if grid and nodes == 1:
                    continue  # hsdp's point is the second node: 2 replicas of 8
                out.append((base.replace(strategy=s, devices=n, batch_size=rows * n, **extra), nodes))
    return out


def gpu_projection(quick: bool, say, names=None, written=None, every_row: bool = False) -> dict:
    """The item's result; `written(result)` after each row (the standalone run keeps what it has). --quick skips
    it: the suite's `bench --quick` has no time to spare, and tests/jaxdp/analysis/test_gpu_target.py compiles
    small steps for the target already."""
    if not targets.extra_installed():
        return {"skipped": f"needs the gpu-aot extra: {targets.INSTALL}"}
    if quick:
        return {"skipped": "--quick: compiled in the full run only (python -m jaxdp.harness.bench.gpu_target)"}
    result = {"rows": [], "target": "h100", "projected": True, "published": PUBLISHED}
    rows = [(cfg, nodes) for cfg, nodes in cases(names)
            if every_row or (cfg.model, cfg.strategy, cfg.devices) in IN_BENCH]
    for cfg, nodes in rows:
        say(f"gpu projection: {cfg.model} {cfg.strategy} on {cfg.devices} H100s ({nodes} node(s)), compiling")
        result["rows"].append(_row(cfg.validate(), nodes))
        if written:
            written(result)
    return result


def section(results: dict) -> list:
    """bench.md's table for item 12 (or the reason it was skipped)."""
    item = results.get("gpu_projection", {})
    if "skipped" in item:
        return ["", "## 12. Compiled for H100s (XLA:GPU, no GPU): skipped", "", item["skipped"]]
    rows = item.get("rows", [])
    if not rows:
        return []
    lines = ["", "## 12. Compiled for H100s by XLA:GPU on this CPU machine; step time and MFU PROJECTED", "",
             "| model | strategy | GPUs | nodes | peak GiB | fits | bytes / theory | overlap FLOPs | projected ms "
             "(range) | projected MFU % (range) |", "|---|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        ratio = r["bytes_per_device"] / r["theory_bytes_per_device"] if r["theory_bytes_per_device"] else 0.0
        step, low, high = r["projected_step_s"], r.get("step_low_s", r["projected_step_s"]), r.get("step_high_s",
                                                                                                  r["projected_step_s"])
        mfu = r["projected_mfu"] * step
        lines.append(f"| {r['model']} | {r['strategy']} | {r['devices']} | {r['nodes']} | "
                     f"{r['peak_bytes'] / 2**30:.1f} | {'yes' if r['fits'] else 'NO'} | {ratio:.3f} | "
                     f"{r['overlap_flops']:.3g} | {calibration.span(low, high, 1e3)} | "
                     f"{calibration.span(mfu / high, mfu / low, 100)} |")
    return lines + ["", "Published, for scale: " + "; ".join(item["published"]) + "."]


if __name__ == "__main__":
    gpu_projection(False, lambda m: print(m, file=sys.stderr, flush=True), sys.argv[2:] or None,
                   lambda result: atomic.write_json(sys.argv[1], result, indent=1), every_row=True)
