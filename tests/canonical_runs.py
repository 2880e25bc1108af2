"""Runs `reduction="canonical"` configurations in one process, for tests/jaxdp/canonical/test_canonical.py: it must
start with XLA:CPU's fused multiply-adds off (`jaxdp.devices.setup(..., reduction="canonical")`
sets them off before JAX starts), which the rest of the suite's process does not have.

    python -m tests.canonical_runs CASES.json OUT_DIR [--allow-fma] [--devices=N] [--free-threads]

CASES.json: a list of {"name", "config": RunConfig fields, "mutate": null | "cse" | "simplifier" | "unfenced" |
"fold" | "bn-direct"}, run in order ("{out}" in a string field is OUT_DIR: a checkpoint folder, saved by one case,
resumed by a later one). Writes OUT_DIR/<name>.npz (the trace's arrays) and prints each case's CPU seconds to
stderr (shown when the test fails). Mutations, to show the checks can fail: `cse` compiles with XLA's
common-subexpression elimination on; `simplifier` with the algebraic simplifier on where a scalar of the
optimizer's update has a lone broadcast too (`canonical.compiler.compiler_options`); `unfenced` leaves out the
barriers of the mean's division and of the clip (`canonical.reduce.fence`); `fold` adds the devices' partial sums
in a left fold instead of the tree; `bn-direct` leaves BatchNorm's statistics' share out of the gradient;
--allow-fma runs with fused multiply-adds (no flag). --devices=N: a process of N CPU devices (default 8);
--free-threads leaves XLA:CPU's intra-op pool at its own size (max(CPUs, N): `devices.request_fixed_threads`
not called).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np


def _mutate(kind: str | None):
    from jaxdp.canonical import batchnorm, compiler, reduce

    saved = (dict(compiler.COMPILER_OPTIONS), reduce.tree, batchnorm.share, compiler.compiler_options, reduce.FENCED)
    if kind == "bn-direct":  # BatchNorm's statistics held constant in backward: their share left out
        batchnorm.share = lambda z, mean, c: 0 * z
    elif kind == "cse":  # no pass off: common-subexpression elimination back on
        compiler.COMPILER_OPTIONS.clear()
    elif kind == "simplifier":  # the simplifier on where a scalar of the update has a lone broadcast too
        compiler.compiler_options = lambda params, optimizer=None: compiler.COMPILER_OPTIONS
    elif kind == "unfenced":  # the mean's division and the clip's scaling without their barriers
        reduce.FENCED = False
    elif kind == "fold":
        def fold(stacked):
            def reduce(a):
                total = a[0]
                for i in range(1, a.shape[0]):
                    total = total + a[i]
                return total
            import jax
            return jax.tree.map(reduce, stacked)
        reduce.tree = fold
    return saved


def _restore(saved):
    from jaxdp.canonical import batchnorm, compiler, reduce

    compiler.COMPILER_OPTIONS.clear()
    compiler.COMPILER_OPTIONS.update(saved[0])
    reduce.tree = saved[1]
    batchnorm.share = saved[2]
    compiler.compiler_options, reduce.FENCED = saved[3], saved[4]


def main(argv) -> None:
    cases, out = json.loads(Path(argv[0]).read_text()), Path(argv[1])
    from jaxdp import devices

    if "--allow-fma" in argv:  # a mutation: the run proceeds without the flag
        devices.request_no_fma = lambda: None
        devices.no_fma_flag_set = lambda: True
    if "--free-threads" in argv:
        devices.request_fixed_threads = lambda: None
        devices.fixed_threads_set = lambda: True  # and parallelize's check of it passed
    n = next((int(a.partition("=")[2]) for a in argv if a.startswith("--devices=")), 8)
    devices.setup(n, "cpu", reduction="canonical")
    import jax

    from jaxdp import train
    from jaxdp.core.run.config import RunConfig

    for case in cases:
        saved = _mutate(case.get("mutate"))
        config = {k: v.replace("{out}", str(out)) if isinstance(v, str) else v for k, v in case["config"].items()}
        # As `jaxdp train` runs it: float64 turns x64 on, other dtypes run without (with x64 on, some of
        # optax's float32 scalars are computed in float64: other bits, the same on every N).
        jax.config.update("jax_enable_x64", config.get("dtype") == "float64")
        t0 = time.process_time()
        try:
            result = train.run(RunConfig(**config).validate(), record=True, progress=False)
        finally:
            _restore(saved)
        np.savez(out / f"{case['name']}.npz", **result.arrays)
        print(f"{time.process_time() - t0:6.2f} {case['name']}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
