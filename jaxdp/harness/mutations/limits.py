"""The judge's detection limits, measured: on an honest pair of real traces (gpt2 + AdamW; jaxdp ddp on
2 devices against torch_ref ddp, 4 steps), tensor by tensor, the smallest relative error that
`jaxdp.harness.parity.judge` fails, for three bugs, next to the pair's largest honest errors:

  lr       the tensor's learning rate 1 + d times the nominal one, at every step (`with_lr`);
  element  one element's update 1 + d times its own at step 2 (the tensor's median element by
           |du| / ulp(p), its typical resolution: `scaled_element`);
  grad     the tensor's recorded gradient 1 + d times itself at step 2 (`scaled_grad`).

    python -m jaxdp.harness.mutations.limits [--dtypes float64,float32,bfloat16]

The smallest d caught is found by bisection over quarter-decades from 1e-16 to 1 (the judge fails
larger errors wherever it fails a smaller one). docs/PARITY.md's detection-limit table is this
module's output.
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
BUGS = ("lr", "element", "grad")


def _before(t: trace.Trace, step: int, name: str) -> np.ndarray:
    return t.arrays[f"init/{name}" if step == t.first_step else f"step/{step - 1}/param/{name}"].astype(np.float64)


def _shifted(t: trace.Trace, step: int, name: str, delta) -> trace.Trace:
    """`t` with the parameters of `name` moved by `delta` from step `step` on."""
    arrays = dict(t.arrays)
    for k in range(step, t.steps + 1):
        key = f"step/{k}/param/{name}"
        arrays[key] = (arrays[key].astype(np.float64) + delta).astype(t.arrays[key].dtype)
    return trace.Trace(t.meta, arrays)


def scaled_update(t: trace.Trace, step: int, name: str, d: float) -> trace.Trace:
    """A tensor's update at step k scaled by 1 + d: its parameters from step k on move by d x that update."""
    after = t.arrays[f"step/{step}/param/{name}"].astype(np.float64)
    return _shifted(t, step, name, d * (after - _before(t, step, name)))


def with_lr(t: trace.Trace, name: str, d: float) -> trace.Trace:
    """The tensor's learning rate 1 + d times the nominal one at every step (each update scaled)."""
    for step in range(t.first_step, t.steps + 1):
        t = scaled_update(t, step, name, d)
    return t


def typical_element(t: trace.Trace, step: int, name: str) -> tuple:
    """The index of the tensor's median element by |du| / ulp(p): how finely its update is stored."""
    p = t.arrays[f"step/{step}/param/{name}"]
    du = np.abs(p.astype(np.float64) - _before(t, step, name))
    resolution = (du / np.spacing(np.abs(p)).astype(np.float64)).reshape(-1)
    flat = int(np.argsort(resolution)[resolution.size // 2])
    return np.unravel_index(flat, p.shape)


def scaled_element(t: trace.Trace, step: int, name: str, d: float) -> trace.Trace:
    """One element's update (`typical_element`) at step k scaled by 1 + d."""
    i = typical_element(t, step, name)
    du = t.arrays[f"step/{step}/param/{name}"].astype(np.float64) - _before(t, step, name)
    delta = np.zeros_like(du)
    delta[i] = d * du[i]
    return _shifted(t, step, name, delta)


def element_at(t: trace.Trace, step: int, name: str, share: float | None) -> tuple:
    """The index of the element whose update at `step` is the smallest of those at least `share` of the tensor's
    largest |du| (None: the tensor's median element by |du|)."""
    p = t.arrays[f"step/{step}/param/{name}"]
    du = np.abs(p.astype(np.float64) - _before(t, step, name)).reshape(-1)
    if share is None:
        flat = int(np.argsort(du)[du.size // 2])
    else:
        flat = int(np.argmin(np.where(du >= share * du.max(), du, np.inf)))
    return np.unravel_index(flat, p.shape)


def shifted_element(t: trace.Trace, step: int, name: str, index: tuple, d: float) -> trace.Trace:
    """One element's update at step k off by `d`, absolute."""
    delta = np.zeros(t.arrays[f"init/{name}"].shape)
    delta[index] = d
    return _shifted(t, step, name, delta)


def scaled_grad(t: trace.Trace, step: int, name: str, d: float) -> trace.Trace:
    key = f"step/{step}/grad/{name}"
    g = t.arrays[key]
    return trace.Trace(t.meta, {**t.arrays, key: (g.astype(np.float64) * (1 + d)).astype(g.dtype)})


def edit(bug: str, name: str, step: int = 2):
    return {"lr": lambda t, d: with_lr(t, name, d), "element": lambda t, d: scaled_element(t, step, name, d),
            "grad": lambda t, d: scaled_grad(t, step, name, d)}[bug]


def smallest_caught(a: trace.Trace, b: trace.Trace, change) -> float:
    """The smallest d of GRID for which judge(change(a, d), b) fails (inf: none)."""
    if parity.judge(change(a, GRID[-1]), b, check_config=False).ok:
        return float("inf")
    lo, hi = -1, len(GRID) - 1  # GRID[hi] caught; GRID[lo] (or nothing) not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if parity.judge(change(a, GRID[mid]), b, check_config=False).ok:
            lo = mid
        else:
            hi = mid
    return GRID[hi]


def limits(a: trace.Trace, b: trace.Trace) -> dict:
    """{bug: {name: d}} per tensor, the smallest relative error caught, and 'honest': judge(a, b).worst."""
    honest = parity.judge(a, b, check_config=False)
    out = {bug: {n: smallest_caught(a, b, edit(bug, n)) for n in b.names()} for bug in BUGS}
    return out | {"honest": honest.worst, "honest_ok": honest.ok}


def pair(dtype: str) -> tuple[trace.Trace, trace.Trace]:
    """The honest pair: jaxdp ddp against torch_ref ddp, gpt2 + AdamW on 2 devices, 4 steps."""
    cfg = GPT2.replace(strategy="ddp", dtype=dtype, steps=4)
    j, t = pair_runs.run_jax(cfg), pair_runs.run_torch([cfg])[cfg]
    return trace.Trace(j.meta, j.arrays), trace.Trace(t.meta, t.arrays)


def row(dtype: str, result: dict) -> str:
    def spread(values):
        v = sorted(values.values())
        worst = sorted(name for name, x in values.items() if x == v[-1])
        return f"{v[0]:.0e} / {v[len(v) // 2]:.0e} / {v[-1]:.0e} ({', '.join(worst[:3])})"

    h = result["honest"]
    return (f"| {dtype} | " + " | ".join(spread(result[bug]) for bug in BUGS)
            + f" | {h['update']:.1e} | {h['grad']:.1e} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxdp.harness.mutations.limits",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="float64,float32,bfloat16")
    args = parser.parse_args(argv)
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    jax.config.update("jax_enable_x64", True)
    print("| dtype | learning rate 1 + d on one tensor, every step: min / median / max over tensors (worst) "
          "| one element's update at step 2 | one tensor's gradient at step 2 | honest update | honest grad |")
    print("|---|---|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        print(row(dtype, limits(*pair(dtype))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
