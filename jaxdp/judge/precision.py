"""The judge's bounds from the traces' precision census (meta `precision`, jaxdp/core/traces/census.py;
docs/PARITY.md, "Precision census").

A run whose census lists ops below its dtype (a float64 transformers model: LlamaRMSNorm's float32 upcast,
eager attention's float32 softmax, float32 rotary angles) computes its losses and gradients with that dtype's
roundoff: two honest float64 runs of it differ by ~1e-8 there, not ~1e-15. It is judged accordingly, and no
looser than that:
  loss, grad             the lower dtype's constant bounds (float32's for float32 sites)
  gradient floors        the lower dtype's unit roundoff (jaxdp/judge/error_model.py's `grad_floors`)
  param, update, step update, elementwise, and the bounds derived from the traces (jaxdp/judge/resolution.py)
                         the run's own: the optimizer's replay carries the gradients' recorded differences
                         into the updates and parameters exactly (float64), and what is left is the run's
                         own update arithmetic and storage
A run whose census lists no lower site (or a trace without a census) keeps its dtype's bounds.
"""
from __future__ import annotations

from dataclasses import replace

from ..core.traces import census as census_mod

KEY = census_mod.KEY


def model_sites(census) -> list[dict]:
    """The lower sites of the model's own computation: its forward, and the backward of the autograd nodes its
    modules' forwards made. A lower dtype anywhere else (a cast before the gradients' reduction, in a comm hook
    or in the optimizer: the data-parallel code's, phase `outside` or an unattributed `backward`) is no reason
    to judge the run more loosely: it is what a bf16-reduction bug looks like, and `line` names it."""
    return [s for s in census_mod.lower_sites(census)
            if s.get("phase") == "forward"
            or (s.get("phase") == "backward" and s.get("module") not in ("", "backward"))]


def censuses(*metas) -> list[dict]:
    """The censuses with lower-precision sites of the model's computation among `metas` (trace metas)."""
    return [c for m in metas if model_sites(c := (m or {}).get(census_mod.KEY))]


def roundoff_dtype(*metas) -> str | None:
    """The lowest dtype any of `metas`' models computed in below its run's dtype; None when none did."""
    return census_mod.lowest(s["dtype"] for c in censuses(*metas) for s in model_sites(c))


def unit(run_dtype: str, *metas) -> float:
    """The unit roundoff at which gradients' roundoff enters: the lower sites' dtype, else the run's."""
    return census_mod.UNIT[roundoff_dtype(*metas) or run_dtype]


def merged(a_meta: dict, b_meta: dict) -> dict | None:
    """The census that sets the bounds of A against B: the one with the lowest lower-precision sites (B's on a
    tie), None when neither has any."""
    found = censuses(b_meta, a_meta)
    low = roundoff_dtype(b_meta, a_meta)
    return next((c for c in found if any(s["dtype"] == low for s in model_sites(c))), None)


def judged_meta(a, b) -> dict:
    """B's meta with the census that sets the bounds of trace A against trace B (`merged`) as its `precision`."""
    return {**b.meta, KEY: merged(a.meta, b.meta)}


def bounds(tol, census, rows: dict, family: str):
    """`tol` (the run dtype's row of `rows`, parity.TOLERANCES) with the loss and gradient bounds of the census's
    lowest lower-precision dtype (float32's for float32 sites; bf16's for float16 or bfloat16 ones): `tol` itself
    when the census has no lower site."""
    low = roundoff_dtype({census_mod.KEY: census}) if census else None
    if low is None:
        return tol
    row = rows[("float32" if low == "float32" else "bfloat16", family)]
    return replace(tol, loss=max(tol.loss, row.loss), grad=max(tol.grad, row.grad),
                   why=f"{census.get('dtype')} run with {low} sites (precision census): losses and gradients at "
                       f"{low}'s roundoff; updates and parameters at {census.get('dtype')}'s once the optimizer "
                       f"replays the gradients' differences")


def line(a_meta: dict, b_meta: dict, sides=("A", "B")) -> str:
    """The verdict's one line on lower precision ('' when neither census lists a lower site)."""
    said = {side: census_mod.describe((meta or {}).get(census_mod.KEY))
            for side, meta in zip(sides, (a_meta, b_meta), strict=True)}
    if not any(said.values()):
        return ""
    same = len(set(said.values())) == 1
    parts = [f"{' and '.join(sides)}: {said[sides[0]]}"] if same else [f"{s}: {d}" for s, d in said.items() if d]
    run = (b_meta.get(census_mod.KEY) or a_meta.get(census_mod.KEY) or {}).get("dtype") or b_meta.get("dtype")
    low = roundoff_dtype(a_meta, b_meta)
    stray = sum(len(census_mod.lower_sites(c)) - len(model_sites(c))
                for c in ((m or {}).get(census_mod.KEY) for m in (a_meta, b_meta)))
    if low is None:  # lower ops outside the model's computation only: judged at the run's dtype, and said
        return (f"lower precision outside the model in a {run} run ({'; '.join(parts)}): {stray} op(s) in the "
                f"data-parallel code (a reduction or an optimizer in a lower dtype?): judged at {run}'s bounds")
    fix = ("torch_ref.precision.keep_float64() (docs/LIBRARY.md)" if run == "float64" else
           f"keep those ops in {run}")
    return (f"lower precision in a {run} run: {'; '.join(parts)}: losses and gradients judged at {low}'s roundoff, "
            f"updates at {run}'s after the optimizer's replay; for the tight {run} check, record under {fix}")


def to_json(a_meta: dict, b_meta: dict) -> dict | None:
    """`--json`'s `precision`: each side's census (None where a trace has none) and the dtype roundoff was
    judged at; None when neither trace has a census."""
    a, b = ((m or {}).get(census_mod.KEY) for m in (a_meta, b_meta))
    if a is None and b is None:
        return None
    return {"a": a, "b": b, "judged_at": roundoff_dtype(a_meta, b_meta), "line": line(a_meta, b_meta)}
