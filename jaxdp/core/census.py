"""The precision census of a run, as a trace's meta holds it (`meta["precision"]`, docs/TRACE.md): where the
run computed in a floating dtype lower than its own. Both frameworks fill it the same way (torch_ref/precision.py
from a dispatch-level record of the first step, jaxdp/precision.py from the step's jaxpr); the judge reads it
(jaxdp/harness/precision.py). NumPy only, shared by both sides.

    {"dtype": "float64",                 the run's dtype
     "lowest": "float32",                the lowest floating dtype any op computed in
     "sites": [{"module": "model.layers.0.input_layernorm", "class": "LlamaRMSNorm", "op": "rsqrt",
                "dtype": "float32", "phase": "forward", "count": 1}, ...],   at most MAX_SITES: each (class, op,
                                         dtype, phase) once first, then the rest, the most frequent first
     "total": 38,                        the sites before the cap
     "ops": 412}                         the lower-precision ops counted (every site's count)

`sites` lists only ops lower than the run's dtype (a float64 run: float32, float16, bfloat16 ops; a float32 run:
float16 and bfloat16); a bfloat16 run lists none and keeps the summary (`lowest`).
"""
from __future__ import annotations

from collections.abc import Mapping

KEY = "precision"
MAX_SITES = 64
# unit roundoff of each floating dtype: the order of precision, and what the judge takes where one enters
UNIT = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def lower(dtype: str, than: str) -> bool:
    """Whether floating dtype `dtype` is less precise than `than` (unknown names are never lower)."""
    return dtype in UNIT and than in UNIT and UNIT[dtype] > UNIT[than]


def lowest(dtypes) -> str | None:
    """The least precise of `dtypes` (known names only), or None."""
    known = [d for d in dtypes if d in UNIT]
    return max(known, key=UNIT.get) if known else None


def summary(run_dtype: str, counts: Mapping, seen=()) -> dict:
    """The census from `counts` {(module, class, op, dtype, phase): count} of the ops lower than `run_dtype`
    (others are dropped here) and `seen`, every floating dtype any op computed in."""
    kept = {key: n for key, n in counts.items() if lower(key[3], run_dtype)}
    ordered = sorted(kept.items(), key=lambda kv: (-kv[1], kv[0]))
    first = {}  # each (class, op, dtype, phase)'s most frequent site is kept before any second one
    for key, _ in ordered:
        first.setdefault(key[1:], key)
    ordered.sort(key=lambda kv: first[kv[0][1:]] != kv[0])  # stable: by count within each group
    sites = [{"module": m, "class": c, "op": op, "dtype": d, "phase": phase, "count": int(n)}
             for (m, c, op, d, phase), n in ordered[:MAX_SITES]]
    low = lowest(list(seen) + [key[3] for key in counts])
    return {"dtype": run_dtype, "lowest": low or run_dtype, "sites": sites, "total": len(kept),
            "ops": int(sum(kept.values()))}


def lower_sites(census) -> list[dict]:
    """The sites of a census (a meta's `precision`, or None) lower than its run's dtype."""
    if not isinstance(census, Mapping):
        return []
    run = census.get("dtype")
    return [s for s in census.get("sites") or () if isinstance(s, Mapping) and lower(s.get("dtype"), run)]


def describe(census, most: int = 4) -> str:
    """'5 float32 sites (LlamaRMSNorm at model.layers.0.input_layernorm (rsqrt, mean, ...); softmax in
    LlamaAttention at model.layers.0.self_attn; ...)': the sites by module class, the first path of each."""
    sites = lower_sites(census)
    if not sites:
        return ""
    by_class: dict = {}
    for s in sites:
        by_class.setdefault(s.get("class") or "(no module)", []).append(s)
    parts = []
    for cls, group in sorted(by_class.items(), key=lambda kv: -sum(s["count"] for s in kv[1]))[:most]:
        ops = list(dict.fromkeys(s["op"] for s in group))
        path = next((s["module"] for s in group if s.get("module")), "")
        where = f" at {path}" + (f" and {len({s['module'] for s in group}) - 1} more" if
                                  len({s["module"] for s in group}) > 1 else "") if path else ""
        parts.append(f"{cls}{where} ({', '.join(ops[:3])}{', ...' if len(ops) > 3 else ''})")
    more = f"; {len(by_class) - most} more classes" if len(by_class) > most else ""
    dtypes = "/".join(sorted({s["dtype"] for s in sites}, key=UNIT.get))
    total = census.get("total", len(sites))
    return f"{total} {dtypes} sites ({'; '.join(parts)}{more})"
