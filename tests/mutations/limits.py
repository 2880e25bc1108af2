"""The judge's detection limits, measured: on an honest pair of real traces per family (AdamW, lr 1e-3, weight
decay 0.01, 4 steps; the project's models: jaxdp ddp on 2 devices against torch_ref `single`; transformers'
(tests/mutations/hf_honest.py): torch_ref ddp on 2 ranks against `single`), per tensor kind (kernel,
bias, norm scale, embedding), the smallest error that `jaxdp.judge.parity.judge` fails, for three bugs:

  lr       the tensor's learning rate 1 + d times the nominal one, at every step (`with_lr`), d relative;
  element  one element's update off by d, absolute, at step 2: the element whose update is the smallest of
           those at least 1e-3 of the tensor's largest (`element_at`, `shifted_element`);
  grad     the tensor's recorded gradient 1 + d times itself at step 2 (`scaled_grad`), d relative.

    python -m tests.mutations.limits [--families gpt2,hf-llama] [--dtypes float64,float32]
                                             [--json docs/results/limits.json]

Per kind one tensor is measured, the kind's least resolved: the largest median ulp(p) / |du| at step 2
(`least_resolved`), so the row is that tensor's limit, named in the results. The smallest d caught is found
by bisection over half-decades (the judge fails larger errors wherever it fails a smaller one). The results
file holds every number; docs/LIMITS.md's table is its rendering (`limits_doc.render`, test-checked).
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: see torch_ref/__init__.py

from jaxdp.core.files import atomic  # noqa: E402
from jaxdp.core.traces import trace  # noqa: E402
from jaxdp.harness import pair_runs  # noqa: E402
from jaxdp.judge import parity  # noqa: E402

from . import hf_honest, hf_models, honest, limits_doc  # noqa: E402

GRID = [10.0 ** (-e / 2) for e in range(32, -1, -1)]  # 1e-16 ... 1, half-decades (relative)
ABSOLUTE = [10.0 ** (-e / 2) for e in range(36, 3, -1)]  # 1e-18 ... 1e-2, half-decades (absolute, one element)
BUGS = limits_doc.BUGS
KINDS = limits_doc.KINDS
FAMILIES = ("mlp", "gpt", "gpt2", "llama", "cnn", *(f"hf-{m}" for m in hf_models.FAMILIES))
LR = 1e-3


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


def smallest_caught(a: trace.Trace, b: trace.Trace, change, grid=GRID) -> float:
    """The smallest d of `grid` for which judge(change(a, d), b) fails (inf: none)."""
    if parity.judge(change(a, grid[-1]), b, check_config=False).ok:
        return float("inf")
    lo, hi = -1, len(grid) - 1  # grid[hi] caught; grid[lo] (or nothing) not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if parity.judge(change(a, grid[mid]), b, check_config=False).ok:
            lo = mid
        else:
            hi = mid
    return grid[hi]


def kind(name: str) -> str:
    """A tensor's kind by its name's last part ('' for none of the four)."""
    last = name.rsplit("/", 1)[-1]
    return {"kernel": "kernel", "bias": "bias", "scale": "norm scale", "embedding": "embedding"}.get(last, "")


def least_resolved(t: trace.Trace, names: list, step: int = 2) -> str:
    """Of `names`, the one whose update at `step` its storage resolves worst: the largest median ulp(p) / |du|."""
    def coarseness(name):
        p = t.arrays[f"step/{step}/param/{name}"]
        du = np.abs(p.astype(np.float64) - _before(t, step, name))
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(np.nanmedian(np.spacing(np.abs(p)).astype(np.float64) / du))
    return max(sorted(names), key=coarseness)


def limits(a: trace.Trace, b: trace.Trace) -> dict:
    """{kind: {"tensor": name, "lr": d, "element": d, "grad": d}} and 'honest': whether judge(a, b) passes."""
    honest = parity.judge(a, b, check_config=False)
    out = {"honest_ok": honest.ok, "kinds": {}}
    for k in KINDS:
        names = [n for n in b.names() if kind(n) == k and f"step/2/param/{n}" in b.arrays]
        if not names:
            continue
        out["kinds"][k] = cell(a, b, least_resolved(b, names))
    return out


def cell(a: trace.Trace, b: trace.Trace, name: str) -> dict:
    """One tensor's three limits (module docstring)."""
    index = element_at(a, 2, name, 1e-3)
    return {"tensor": name, "lr": smallest_caught(a, b, lambda t, d: with_lr(t, name, d)),
            "element": smallest_caught(a, b, lambda t, d: shifted_element(t, 2, name, index, d), ABSOLUTE),
            "grad": smallest_caught(a, b, lambda t, d: scaled_grad(t, 2, name, d))}


def hf_world(rank: int, n: int, cases: list, lr: float) -> list:
    """hf_honest.run_world with AdamW at `lr` (its own default is 1e-2)."""
    hf_honest.LR["adamw"] = lr
    return hf_honest.run_world(rank, n, cases)


def project_pair(model: str, dtype: str) -> tuple[trace.Trace, trace.Trace]:
    """jaxdp ddp on 2 devices against torch_ref single: the honest matrix's model, AdamW."""
    cfg = honest.BASE.replace(dtype=dtype, optimizer="adamw", **honest.MODELS[model], lr=LR, weight_decay=0.01)
    j = pair_runs.run_jax(cfg.replace(strategy="ddp", devices=2))
    t = next(iter(pair_runs.run_torch([cfg.replace(strategy="single", devices=1)]).values()))
    return trace.Trace(j.meta, j.arrays), trace.Trace(t.meta, t.arrays)


def hf_pairs(models: list, dtype: str) -> dict:
    """{hf-model: (torch_ref ddp on 2 ranks, single)}, AdamW at LR."""
    from torch_ref.launch import launch

    cases = [dict(model=m, optimizer="adamw", dtype=dtype, steps=honest.BASE.steps) for m in models]
    ddp = launch(hf_world, 2, [dict(c, strategy="ddp", devices=2) for c in cases], LR, timeout_s=900)[0]
    single = launch(hf_world, 1, [dict(c, strategy="single", devices=1) for c in cases], LR, timeout_s=900)[0]
    return {f"hf-{m}": (trace.Trace(*x), trace.Trace(*y)) for m, x, y in zip(models, ddp, single, strict=True)}


def measure(families: list, dtypes: list, log=print) -> dict:
    """The results file's content: every family's and dtype's `limits`, with what was run."""
    rows = []
    for dtype in dtypes:
        pairs = {f: project_pair(f, dtype) for f in families if f in honest.MODELS}
        hf = [f.removeprefix("hf-") for f in families if f.startswith("hf-")]
        pairs |= hf_pairs(hf, dtype) if hf else {}
        for family in families:
            start = time.time()
            rows.append({"family": family, "dtype": dtype, **limits(*pairs[family])})
            log(f"{family} {dtype}: {time.time() - start:.0f} s", flush=True)
    return {"command": "python -m tests.mutations.limits " + " ".join(
                [f"--families {','.join(families)}", f"--dtypes {','.join(dtypes)}"]),
            "optimizer": f"adamw, lr {LR:g}, weight decay 0.01, {honest.BASE.steps} steps", "rows": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutations.limits",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--dtypes", default="float64,float32")
    parser.add_argument("--json", default="docs/results/limits.json", help="the results file to write")
    args = parser.parse_args(argv)
    families, dtypes = args.families.split(","), args.dtypes.split(",")
    bad = [f for f in families if f not in FAMILIES] + [d for d in dtypes if d not in ("float64", "float32")]
    if bad:
        parser.exit(2, f"--families/--dtypes: {bad[0]!r} is not one of {', '.join(FAMILIES)}; float64, float32\n")
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    jax.config.update("jax_enable_x64", True)
    start = time.time()
    results = measure(families, dtypes)
    results["wall_s"] = round(time.time() - start)
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    atomic.write_json(args.json, results, indent=1)
    print(limits_doc.render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
