"""The judge's detection limits, measured: on an honest pair of real traces (gpt2 + AdamW, the model
where the error model relaxes elements; jaxdp ddp on 2 devices against torch_ref ddp), the smallest
relative error in one tensor's update at one step, or in one tensor's gradient at one step, that
`jaxdp.parity.judge` fails, tensor by tensor; next to the largest honest errors of the same pair.

    python -m jaxdp.mutations.limits [--dtypes float64,float32,bfloat16]

A tensor's update at step k scaled by 1 + d moves its parameters from step k on by d x that update
(`with_update`); a gradient scaled by 1 + d is that step's recorded gradient only. The smallest d
caught is found by bisection over quarter-decades from 1e-16 to 1 (the judge fails larger errors
wherever it fails a smaller one). docs/PARITY.md's detection-limit table is this module's output.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from ...core import trace
from .. import pair_runs, parity
from . import GPT2

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: see torch_ref/__init__.py
GRID = [10.0 ** (-e / 4) for e in range(64, -1, -1)]  # 1e-16 ... 1, quarter-decades


def scaled_update(t: trace.Trace, step: int, name: str, d: float) -> trace.Trace:
    arrays = dict(t.arrays)
    before = t.arrays[f"init/{name}" if step == t.first_step else f"step/{step - 1}/param/{name}"].astype(np.float64)
    delta = d * (t.arrays[f"step/{step}/param/{name}"].astype(np.float64) - before)
    for k in range(step, t.steps + 1):
        key = f"step/{k}/param/{name}"
        arrays[key] = (arrays[key].astype(np.float64) + delta).astype(t.arrays[key].dtype)
    return trace.Trace(t.meta, arrays)


def scaled_grad(t: trace.Trace, step: int, name: str, d: float) -> trace.Trace:
    key = f"step/{step}/grad/{name}"
    g = t.arrays[key]
    return trace.Trace(t.meta, {**t.arrays, key: (g.astype(np.float64) * (1 + d)).astype(g.dtype)})


def smallest_caught(a: trace.Trace, b: trace.Trace, edit) -> float:
    """The smallest d of GRID for which judge(edit(a, d), b) fails (inf: none)."""
    if parity.judge(edit(a, GRID[-1]), b, check_config=False).ok:
        return float("inf")
    lo, hi = -1, len(GRID) - 1  # GRID[hi] caught; GRID[lo] (or nothing) not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if parity.judge(edit(a, GRID[mid]), b, check_config=False).ok:
            lo = mid
        else:
            hi = mid
    return GRID[hi]


def limits(a: trace.Trace, b: trace.Trace, step: int = 2) -> dict:
    """{'update': {name: d}, 'grad': {name: d}, 'honest': judge(a, b).worst}: per tensor, the smallest
    relative error at `step` that the judge catches."""
    honest = parity.judge(a, b, check_config=False)
    out = {"update": {}, "grad": {}, "honest": honest.worst, "honest_ok": honest.ok}
    for name in b.names():
        out["update"][name] = smallest_caught(a, b, lambda t, d, n=name: scaled_update(t, step, n, d))
        out["grad"][name] = smallest_caught(a, b, lambda t, d, n=name: scaled_grad(t, step, n, d))
    return out


def pair(dtype: str) -> tuple[trace.Trace, trace.Trace]:
    """The honest pair: jaxdp ddp against torch_ref ddp, gpt2 + AdamW on 2 devices, 3 steps."""
    cfg = GPT2.replace(strategy="ddp", dtype=dtype)
    j, t = pair_runs.run_jax(cfg), pair_runs.run_torch([cfg])[cfg]
    return trace.Trace(j.meta, j.arrays), trace.Trace(t.meta, t.arrays)


def row(dtype: str, result: dict) -> str:
    def spread(values):
        v = sorted(values.values())
        worst = next((name for name, x in values.items() if x == v[-1]), "")
        return f"{v[0]:.0e} / {v[len(v) // 2]:.0e} / {v[-1]:.0e} ({worst})"

    h = result["honest"]
    return (f"| {dtype} | {spread(result['update'])} | {spread(result['grad'])} | {h['update']:.1e} "
            f"| {h['step update']:.1e} | {h['grad']:.1e} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxdp.mutations.limits", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="float64,float32,bfloat16")
    args = parser.parse_args(argv)
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    jax.config.update("jax_enable_x64", True)
    print("| dtype | update caught from: min / median / max over tensors (worst tensor) | gradient caught from: "
          "min / median / max (worst tensor) | honest update | honest step update | honest grad |")
    print("|---|---|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        print(row(dtype, limits(*pair(dtype))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
