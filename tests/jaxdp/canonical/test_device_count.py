"""`--reduction canonical` across processes of different device counts, as users compare it: `jaxdp train
--strategy single` runs in a 1-device process, `--devices 4` in a 4-device one. test_canonical.py runs every
case in one 8-device process, which cannot see what depends on the process's device count: XLA:CPU sizes
its intra-op (Eigen) thread pool max(CPUs, devices), and Eigen's threaded matrix product blocks the
summed dimension by the pool's size (docs/CANONICAL.md, "The thread pool's size"). On a machine with
fewer CPUs than devices, the 512 x 512 weight gradient of 6 rows per shard then differs by an ulp;
`devices.request_fixed_threads` gives every process one pool size. A 1-device process runs `single`, an
8-device one ddp at N = 8 (every strategy at every N within one process: test_canonical.py), both with the
production environment (no XLA_FLAGS, no PJRT_NPROC, LLVM at its default level).

Shown to fail: with JAXDP_CANONICAL_FULL=1, on a 2-CPU machine (pools of 2 and 8 threads; on more CPUs
they may not differ), `POOL`'s runs with `--free-threads` (the pool left at max(CPUs, devices)) differ, and
the same runs with the fixed pool do not. `POOL` is a 64 x 64 mlp with 512 rows per shard: a small product
over a long summed dimension, which Eigen's threaded product splits by the pool's size. Measured on
2026-11-28: `MLP`'s runs (6 rows per shard), which used to differ, no longer do with the free pool, at this
tree and at the one before it (d9ba2b6): the mutant moved to `POOL`, where the pool still changes 2 arrays.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxdp.core.run.config import RunConfig
from tests import REPO

MLP = RunConfig(model="mlp", data="synthetic", hidden=(512, 512), steps=1, batch_size=48, lr=0.05,
                optimizer="adamw", seed=3, reduction="canonical", shards=8)  # 6 rows per shard
PROCESSES = {1: {"single": MLP},  # process's device count -> {run name: config}
             8: {"ddp": MLP.replace(strategy="ddp", devices=8)}}
POOL = MLP.replace(hidden=(64, 64), batch_size=4096)  # 512 rows per shard
DROPPED = ("XLA_FLAGS", "JAX_DISABLE_MOST_OPTIMIZATIONS", "PJRT_NPROC", "NPROC")


def _run(n: int, runs: dict, out, extra=()) -> dict:
    """`runs` trained in a fresh process of `n` CPU devices: {name: the trace's arrays}."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"cases{n}.json"
    path.write_text(json.dumps([{"name": name, "config": cfg.to_dict(), "mutate": None} for name, cfg in runs.items()]))
    env = {k: v for k, v in os.environ.items() if k not in DROPPED}
    proc = subprocess.run([sys.executable, "-m", "tests.canonical_runs", str(path), str(out), f"--devices={n}",
                           *extra], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {name: dict(np.load(out / f"{name}.npz")) for name in runs}


def _unequal(out, extra=(), config=MLP) -> dict:
    """{run name: the arrays not bitwise equal to `single`'s} for `config`, each process started fresh."""
    processes = {n: {name: config if name == "single" else config.replace(strategy=cfg.strategy, devices=cfg.devices)
                     for name, cfg in runs.items()} for n, runs in PROCESSES.items()}
    traces = {name: arrays for n, runs in processes.items() for name, arrays in _run(n, runs, out, extra).items()}
    ref = traces.pop("single")
    assert any(k.startswith("step/") for k in ref)
    return {name: [k for k in ref if not np.array_equal(ref[k], got[k])] for name, got in traces.items()}


def test_single_in_a_1_device_process_equals_n_device_processes(tmp_path):
    assert _unequal(tmp_path) == {"ddp": []}


@pytest.mark.skipif(not os.environ.get("JAXDP_CANONICAL_FULL"), reason="a mutant run: JAXDP_CANONICAL_FULL=1")
@pytest.mark.skipif((os.cpu_count() or 1) > 2, reason="measured on 2 CPUs: with more, pools of 1 to 4 agree")
def test_the_pool_left_free_differs(tmp_path):
    assert _unequal(tmp_path / "fixed", config=POOL) == {"ddp": []}
    assert any(_unequal(tmp_path / "free", ["--free-threads"], config=POOL).values())
