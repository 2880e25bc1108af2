"""`jaxdp bench`: performance, measured side by side in one run, reported as ratios.

Nine measurements (the keys of the result dictionary, written to bench.json by the CLI):

1. `step_time`: JAX vs torch step time for every strategy both have, at N = 2 and 4, on one
   `mlp` large enough that compute matters and one small `gpt`: same model, batch, dtype and
   initial parameters on both sides; the first (compiling) step and one warm-up step excluded,
   the median of the rest. On each `--kernels` path (default both: `mirrored,fused`; items 2-3 and
   6's first steps too), every row naming its path (torch's: eager, or compiled with `--compile`).
2. `dp_overhead`: each strategy at N devices over `single` on the same global batch and cores.
3. `ring_vs_xla`: the explicit ring (`ddp-ring`) over XLA's all-reduce (`ddp`).
4. `communication`: bytes sent per device per step read from the compiled HLO, against the ring
   theory (`accounting.theory`), for N = 2, 4, 8, 16; rows with `model` `cnn` (sync BatchNorm: its
   statistics' all-reduces in the theory, and its running statistics' own program as
   `stats_measured_bytes` / `stats_theory_bytes`) and `gpt2` (tied wte, counted once) besides the mlp.
5. `memory`: per-device state bytes (parameters, gradient, optimizer state) against N on device 0
   (the gradient's from the lowered step's declared output sharding), next to the ZeRO formula.
6. `compile`: lowering + compilation time of each JAX step, and the first step of each framework.
7. `gpu_throughput`: on a GPU only: tokens/s, TFLOP/s and MFU of a bf16 `gpt` on one device.
8. `collectives`: the hand-written ring all-reduce, reduce-scatter and all-gather timed alone
   against XLA's built-ins (psum, psum_scatter, all_gather), 1-64 MB per device, N = 2 and 4.
9. `reduction`: `--reduction canonical` against `native` per strategy (ZeRO with both collectives),
   N = 4 and 8 (2 in --quick): step time ratio, bytes sent and temporaries of each compiled program,
   both modes in one child process started without fused multiply-adds (`reduction.py`).
10. `jit_vs_hand`: ddp / zero1 / zero3 (shard_map) next to ddp-jit / zero1-jit / fsdp-jit (plain jax.jit),
   auto and explicit, in one run at the largest timed N, accum 1 and 4 (2 in --quick: ddp only): bytes
   against theory, the bytes inside the micro-batch loop, peak bytes, step time (`jit.py`). The -jit
   strategies also appear in items 1 (against their torch twins), 4 and 5 (auto) of the full run.
11. `nan_check`: the step with the fused non-finite check over without it, per strategy, and torch's optimizer
   hooks on one rank (`nan_check.py`).
12. `gpu_projection`: steps compiled by XLA:GPU for H100s on this CPU machine, GPT-2 124M and Llama 3 8B:
   compiled peak and fits, bytes against theory, overlap, and a PROJECTED step time and MFU (`gpu_target.py`,
   docs/GPU.md); the headline rows here, every strategy on 8 and 16 H100s with `python -m
   jaxdp.harness.bench.gpu_target`; skipped without the gpu-aot extra and in --quick.
13. `fused_cost`: fused / mirrored step time per framework, gpt2 in float32 and bf16, single and ddp at N = 2,
   both paths interleaved in one run (`fused_cost.py`); whatever `--kernels` says.

Items 1-6, 8 and 9 run on simulated CPU devices (`--platform cpu`) on every machine: the "devices" share
the machine's cores, and torch's ranks are processes (gloo) on the same cores, so times say how
the programs schedule on this CPU, not how they would communicate on a GPU cluster. Bytes and
memory do not depend on the machine.

The package: `plan` (what runs), `measure` (timed runs; compiled steps in a child process), `gpu`
(item 7), `tables` (bench.json's rows), `goals`, `markdown` (bench.md); `run` below ties them, `write`
writes bench.json and bench.md.
"""
from __future__ import annotations

import datetime
import os
import sys
import time

from ... import devices
from ...core.files import atomic
from ...core.run.timing import WARMUP_STEPS
from . import tables
from .collectives import collectives_benchmark
from .fused_cost import fused_cost_benchmark
from .goals import goals
from .gpu import gpu_throughput
from .gpu_target import gpu_projection
from .jit import jit_vs_hand
from .machine import machine
from .markdown import markdown
from .measure import start_inspect, time_strategies
from .nan_check import nan_check_benchmark
from .plan import Plan, plan
from .reduction import reduction_benchmark

MODEL_FIELDS = ("model", "data", "hidden", "n_layer", "n_head", "n_kv_head", "d_model", "d_ff", "seq_len", "channels",
                "batchnorm", "batch_size", "dtype", "optimizer")


def run(quick: bool = False, out: str | None = None, progress=None, kernels: tuple = ("mirrored", "fused"),
        compile: bool = False) -> dict:
    """Run every item; returns the JSON-serialisable result (the CLI writes bench.json / bench.md). `kernels`:
    the paths items 1-3 time; `compile`: torch.compile on the torch side of those runs."""
    say = progress or (lambda m: print(m, flush=True))
    p = plan(quick, tuple(kernels), compile)
    omp = _passive_omp()
    devices.setup(max(p.time_ns), "cpu")  # before JAX initialises: the count is then fixed
    t0 = time.perf_counter()
    clock: dict = {}
    times = _timed(clock, "items 1-3", time_strategies, p, say)
    say(f"collectives: ring vs XLA built-ins, {p.coll_sizes_mb} MB, N = {p.time_ns}")
    coll = _timed(clock, "item 8", collectives_benchmark, p.coll_sizes_mb, p.time_ns, p.coll_repeats)
    measured = {"gpu_throughput": _timed(clock, "item 7", gpu_throughput, p, say),
                "reduction": _timed(clock, "item 9", reduction_benchmark, p, say),
                "jit_vs_hand": _timed(clock, "item 10", jit_vs_hand, p, say),
                "nan_check": _timed(clock, "item 11", nan_check_benchmark, p, say),
                "fused_cost": _timed(clock, "item 13", fused_cost_benchmark, p, say)}
    # untimed from here: items 4-5's compile child runs beside item 12's compiles (2 cores, one each)
    child = start_inspect(p, say)
    try:
        projection = _timed(clock, "item 12", gpu_projection, quick, say)
        inspected = _timed(clock, "items 4-5 (after item 12)", child.result)
    finally:
        child.stop()  # item 12 failed or was interrupted: no compile child left behind
    results = {
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "quick": quick,
        "machine": machine(),
        "setup": _setup(p, omp),
        "step_time": {"rows": tables.step_time_table(times)},
        "dp_overhead": {"rows": tables.overhead_table(times)},
        "ring_vs_xla": {"rows": tables.ring_table(times)},
        "communication": {"rows": tables.communication_table(inspected)},
        "memory": {"rows": tables.memory_table(inspected)},
        "compile": {"rows": tables.compile_table(inspected, times)},
        "gpu_throughput": measured["gpu_throughput"],
        "collectives": {"rows": coll},
        "reduction": measured["reduction"],
        "jit_vs_hand": measured["jit_vs_hand"],
        "nan_check": measured["nan_check"],
        "fused_cost": measured["fused_cost"],
        "gpu_projection": projection,
    }
    results["goals"] = goals(results)
    results["wall_s"] = time.perf_counter() - t0
    results["item_s"] = {k: round(v, 1) for k, v in clock.items()}
    return tables.jsonable(results)


def _timed(clock: dict, item: str, fn, *args):
    """fn(*args), its wall seconds recorded in `clock[item]` (the bench's `item_s`)."""
    t0 = time.perf_counter()
    out = fn(*args)
    clock[item] = time.perf_counter() - t0
    return out


def write(results: dict, out: str) -> str:
    """bench.json and bench.md in `out`, both or neither (`atomic.staged`); returns bench.md's text."""
    table = markdown(results)
    with atomic.staged(out) as stage:
        atomic.write_json(os.path.join(stage, "bench.json"), results, indent=1)
        atomic.write_text(os.path.join(stage, "bench.md"), table)
    return table


def _setup(p: Plan, omp: str) -> dict:
    return {"omp_wait_policy": omp,
            "platform": "cpu (simulated devices share the cores; torch ranks are gloo processes on the same cores)",
            "kernels": list(p.kernels), "torch_compile": p.torch_compile,
            "steps_per_run": p.steps, "excluded": f"first step (compile) + {WARMUP_STEPS} warm-up",
            "timed_steps": p.steps - 1 - WARMUP_STEPS, "statistic": "median",
            "steps_of": {label: steps for label, steps in p.steps_of},
            "models": {k: {f: getattr(c, f) for f in MODEL_FIELDS} for k, c in p.models.items()},
            "comm_model": {f: getattr(p.comm_model, f)
                           for f in ("model", "hidden", "batch_size", "dtype", "optimizer")},
            "ported_models": {label: {f: getattr(c, f) for f in MODEL_FIELDS} for label, c, *_ in p.model_comm}}


def _passive_omp() -> str:
    """torch's OpenMP threads spin-wait by default; on this 2-core machine a spinning worker starves
    the thread it waits for and a 0.7 ms step of the small mlp takes ~100 ms with 2 threads
    (profiled: see docs/BENCHMARKS.md). PASSIVE (sleep while waiting) must be set before torch
    loads libgomp; the spawned ranks inherit it. Returns what torch runs with."""
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        return os.environ["OMP_WAIT_POLICY"]
    return os.environ.get("OMP_WAIT_POLICY", "default") + " (torch was imported before the bench set it)"


__all__ = ["machine", "markdown", "run", "write"]
