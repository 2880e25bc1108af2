"""The judge's bounds from the traces' precision census (meta `precision`, jaxdp/core/census.py;
docs/PARITY.md, "Precision census").

A run whose census lists ops below its dtype (a float64 transformers model: LlamaRMSNorm's float32 upcast,
eager attention's float32 softmax, float32 rotary angles) computes its losses and gradients with that dtype's
roundoff: two honest float64 runs of it differ by ~1e-8 there, not ~1e-15. It is judged accordingly, and no
looser than that:
  loss, grad             the lower dtype's constant bounds (float32's for float32 sites)
  gradient floors        the lower dtype's unit roundoff (jaxdp/harness/error_model.py's `grad_floors`)
  param, update, step update, elementwise, and the bounds derived from the traces (jaxdp/harness/resolution.py)
                         the run's own: the optimizer's replay carries the gradients' recorded differences
                         into the updates and parameters exactly (float64), and what is left is the run's
                         own update arithmetic and storage
A run whose census lists no lower site (or a trace without a census) keeps its dtype's bounds.
"""
from __future__ import annotations

from dataclasses import replace

from ..core import census as census_mod

KEY = census_mod.KEY


def censuses(*metas) -> list[dict]:
    """The censuses with lower-precision sites among `metas` (trace metas)."""
    return [c for m in metas if census_mod.lower_sites(c := (m or {}).get(census_mod.KEY))]


def roundoff_dtype(*metas) -> str | None:
    """The lowest dtype any of `metas`' censuses computed in below its run's dtype; None when none did."""
    return census_mod.lowest(s["dtype"] for c in censuses(*metas) for s in census_mod.lower_sites(c))


def unit(run_dtype: str, *metas) -> float:
    """The unit roundoff at which gradients' roundoff enters: the lower sites' dtype, else the run's."""
    return census_mod.UNIT[roundoff_dtype(*metas) or run_dtype]


def merged(a_meta: dict, b_meta: dict) -> dict | None:
    """The census that sets the bounds of A against B: the one with the lowest lower-precision sites (B's on a
    tie), None when neither has any."""
    found = censuses(b_meta, a_meta)
    low = roundoff_dtype(b_meta, a_meta)
    return next((c for c in found if any(s["dtype"] == low for s in census_mod.lower_sites(c))), None)


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
    parts = []
    for side, meta in zip(sides, (a_meta, b_meta), strict=True):
        c = (meta or {}).get(census_mod.KEY)
        if census_mod.lower_sites(c):
            parts.append(f"{side}: {census_mod.describe(c)}")
    if not parts:
        return ""
    run = (b_meta.get(census_mod.KEY) or a_meta.get(census_mod.KEY) or {}).get("dtype") or b_meta.get("dtype")
    low = roundoff_dtype(a_meta, b_meta)
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
