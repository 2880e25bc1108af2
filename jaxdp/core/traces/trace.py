"""Comparing traces (`diff`, `format_diff`, the error measures) over the trace file (`tracefile.py`:
the format, docs/TRACE.md); `save`, `load`, `Trace` and `Recorder` are re-exported, so
that `jaxdp.trace` (jaxdp/trace.py, importing them from here) is the one path users import."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..run.config import COMPARABLE_FIELDS
from ..run.records import ByName
from . import spread
from .recorder import Recorder
from .trace_keys import TraceKey, parse_key  # re-exported: `jaxdp.trace.parse_key`
from .tracefile import FIELDS, Trace, TraceDamaged, TraceError, check_writable, load, save
from .ulp import ulp_distance

__all__ = ["FIELDS", "FieldErrors", "Recorder", "Trace", "TraceDamaged", "TraceDiff", "TraceError", "TraceKey",
           "check_writable", "diff", "load", "parse_key", "save"]


def shared_config_fields(a: Trace, b: Trace) -> list[str]:
    """The configuration fields (`config.COMPARABLE_FIELDS`) that both traces' meta carry: a user's
    trace may carry few of them."""
    return [k for k in COMPARABLE_FIELDS if k in a.meta and k in b.meta]


def check_comparable(a: Trace, b: Trace) -> None:
    """Two traces are comparable when they ran the same configuration (strategy, devices and
    framework may differ), judged on the fields both carry. Otherwise raise, naming every field
    that differs."""
    diffs = [f"{k}: {a.meta[k]!r} vs {b.meta[k]!r}" for k in shared_config_fields(a, b) if a.meta[k] != b.meta[k]]
    if diffs:
        raise TraceError("traces ran different configurations: " + "; ".join(diffs)
                         + " (compare them anyway with --no-config-check)")


def errors(a, b, floor: float = 0.0, allow=None, norm_floor: float = 0.0) -> tuple[float, float, float]:
    """(relative, norm, elementwise) errors of `a` against reference `b`:
      relative     max |a - b| / max |b|       (the worst element relative to the array's scale)
      norm         ||a - b|| / ||b||           (2-norms over the whole array)
      elementwise  max_i |a_i - b_i| / max(|b_i|, floor)   (every element relative to itself;
                   those below the absolute `floor` judged against the floor)
    each the absolute error where its scale is 0, and all inf when either array holds NaN or Inf
    (non-finite is never agreement). `allow`: |a - b| beyond these; `norm_floor`: the least ||b||
    (both from jaxdp.judge.error_model)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise TraceError(f"shape mismatch {a.shape} vs {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return math.inf, math.inf, math.inf
    if not b.size:
        return 0.0, 0.0, 0.0
    d, mag = np.abs(a - b), np.abs(b)
    d = d if allow is None else np.maximum(d - allow, 0.0)
    err, scale = float(d.max()), float(mag.max())
    norm_err, norm_scale = float(np.linalg.norm(d)), max(float(np.linalg.norm(b)), norm_floor)
    elementwise = float(np.max(d / np.maximum(mag, max(floor, np.finfo(np.float64).tiny))))
    return (err / scale if scale > 0 else err, norm_err / norm_scale if norm_scale > 0 else norm_err, elementwise)


def relative_error(a, b) -> float:
    """Worst element of |a - b| relative to the largest magnitude of b (the reference); inf when
    either array holds a NaN or an Inf."""
    return errors(a, b)[0]


def norm_error(a, b, allow=None) -> float:
    """||a - b|| / ||b|| (beyond `allow`); inf when either array is non-finite."""
    return errors(a, b, allow=allow)[1]


def updates(t: Trace) -> dict[str, np.ndarray]:
    """Each step's update, `update/<k>/<name>` = param_k - param_(k-1) (the parameters before the
    first recorded step are `init/`), in float64: exact for float32 parameters."""
    out = {}
    for name in t.names():
        before = t.arrays[f"init/{name}"]
        for k in range(t.first_step, t.steps + 1):
            after = t.arrays.get(f"step/{k}/param/{name}")
            if after is None:
                break
            with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: judged as non-finite
                out[f"update/{k}/{name}"] = np.asarray(after, np.float64) - np.asarray(before, np.float64)
            before = after
    return out


def non_finite(t: Trace) -> list[str]:
    """The keys of `t`'s float arrays holding a NaN or an Inf."""
    return sorted(k for k, v in t.arrays.items() if np.asarray(v).dtype.kind == "f" and not np.isfinite(v).all())


# The absolute floor of the elementwise error, by the run's dtype (meta `dtype`): elements smaller
# than this are judged by absolute error. About 1e4 unit roundoffs of float64; float32's unit
# roundoff times the ~20 terms of a short sum (bf16 runs keep float32 master values).
FLOOR = {"float64": 1e-12, "float32": 1e-6, "bfloat16": 1e-6}


@dataclass(frozen=True)
class FieldErrors(ByName):
    """The worst of each measure over one field's arrays (None: not measured for this field)."""
    relative: float | None
    norm: float | None
    elementwise: float | None
    ulp: float | None


class RawErrors(NamedTuple):
    """An array's (norm, elementwise) errors before the error model lowered them (elementwise None for an update)."""
    norm: float
    elementwise: float | None


class Updates(NamedTuple):
    """Both traces' per-step updates (`updates`): `update/<k>/<name>` -> param_k - param_(k-1)."""
    a: dict[str, np.ndarray]
    b: dict[str, np.ndarray]


@dataclass(frozen=True)
class TraceDiff(ByName):
    """`diff`'s result: errors of `a` against reference `b`, per array (by trace key) and per field.
      per_array / worst:  the worst |a - b| over the largest |b| per array / per field;
      norm:               ||a - b|| / ||b|| per array, the per-step updates (`update/<k>/<name>`) included;
      elementwise:        max |a_i - b_i| / max(|b_i|, floor) per array (floor: FLOOR[dtype]);
      ulp:                the largest ULP distance per float array (in its own dtype; with_ulp);
      non_finite:         {key: 'a', 'b' or 'a and b'}: arrays holding NaN or Inf, whose errors are inf;
      fields:             {field: FieldErrors}: the worst of each measure;
      floor:              the elementwise measure's absolute floor;
      raw, updates:       the error model's keys' RawErrors without it; both traces' Updates;
      spread:             each trace's rank-spread findings (`jaxdp.core.traces.spread`: its `step/<k>/spread/`
                          keys, a property of one run, never compared across the two).
    (`result["worst"]` reads as `result.worst`, for code written when this was a dict.)"""
    worst: dict[str, float]
    per_array: dict[str, float]
    norm: dict[str, float]
    elementwise: dict[str, float]
    ulp: dict[str, float]
    non_finite: dict[str, str]
    fields: dict[str, FieldErrors]
    floor: float
    raw: dict[str, RawErrors] = field(default_factory=dict)
    updates: Updates = field(default_factory=lambda: Updates({}, {}))
    spread: list = field(default_factory=list)


def diff(a: Trace, b: Trace, check_config: bool = True, floor: float | None = None, with_ulp: bool = True,
         allowance=None, sides=("a", "b")) -> TraceDiff:
    """Errors of `a` against reference `b`, per array and per field (`TraceDiff`). Arrays present in
    only one trace are an error. `sides` name the traces in the spread findings. `allowance`
    (jaxdp.judge.error_model): param/update errors beyond its allowances, gradients above its floors."""
    if check_config:
        check_comparable(a, b)
    found, a, b = spread.split(a, b, sides)
    only = sorted(set(a.arrays) ^ set(b.arrays))
    if only:
        raise TraceError(f"traces hold different arrays, e.g. {only[:3]} ({len(only)} in all)")
    floor = FLOOR.get(b.meta.get("dtype"), 1e-6) if floor is None else floor
    keys = sorted(a.arrays)
    per_array, norm, elementwise, raw = {}, {}, {}, {}  # raw: before the error model
    for k in keys:
        per_array[k], norm[k], elementwise[k] = errors(a.arrays[k], b.arrays[k], floor)
        if allowance and (k in allowance.param or k in allowance.grad_floor):  # relative stays the raw one
            raw[k] = RawErrors(norm[k], elementwise[k])
            _, norm[k], elementwise[k] = allowance.errors(k, a.arrays[k], b.arrays[k], floor)
    ups = Updates(updates(a), updates(b))
    for k in (k for k in sorted(ups.b) if k in ups.a):
        norm[k] = norm_error(ups.a[k], ups.b[k])
        if allowance and k in allowance.update:
            raw[k], norm[k] = RawErrors(norm[k], None), norm_error(ups.a[k], ups.b[k], allowance.update[k])
    ulp = {k: u for k in keys if (u := ulp_distance(a.arrays[k], b.arrays[k])) is not None} if with_ulp else {}
    bad_a, bad_b = set(non_finite(a)), set(non_finite(b))
    nonfinite = {k: " and ".join(s for s, bad in (("a", bad_a), ("b", bad_b)) if k in bad)
                 for k in sorted(bad_a | bad_b)}
    worst, fields = _per_field(per_array, norm, elementwise, ulp)
    return TraceDiff(worst, per_array, norm, elementwise, ulp, nonfinite, fields, floor, raw, ups, found)


def _per_field(per_array: dict, norm: dict, elementwise: dict, ulp: dict) -> tuple[dict, dict]:
    """(worst relative error per field, FieldErrors per field); a key outside the format counts in none."""
    field_of = {k: parsed.field for k in set(per_array) | set(norm) if (parsed := parse_key(k)) is not None}
    worst = {f: 0.0 for f in FIELDS if f != "update"}
    for key, err in per_array.items():
        if field_of.get(key) in worst:
            worst[field_of[key]] = max(worst[field_of[key]], err)
    found = {f: {"relative": worst.get(f), "norm": 0.0, "elementwise": None if f == "update" else 0.0, "ulp": None}
             for f in FIELDS}
    for name, table in (("norm", norm), ("elementwise", elementwise), ("ulp", ulp)):
        for key, err in table.items():
            if field_of.get(key) in found:
                entry = found[field_of[key]]
                entry[name] = err if entry[name] is None else max(entry[name], err)
    return worst, {f: FieldErrors(**e) for f, e in found.items()}


def format_diff(result: TraceDiff, tolerance: float | None = None) -> str:
    """One line per field: the worst relative error (and, with `tolerance`, ok or MISMATCH), the
    worst norm-based and elementwise errors and ULP distance; then the non-finite arrays, by key, and the
    rank-spread findings."""
    lines = [f"{'field':<6}  {'relative':>9}  {'norm':>9}  {'elementwise':>11}  {'ulp':>9}"
             f"   (relative: worst |a-b| / max|b|; elementwise floor {result.floor:g})"]
    for name, e in result.fields.items():
        rel = e.relative
        flag = "" if tolerance is None or rel is None else ("  ok" if rel <= tolerance else "  MISMATCH")
        lines.append(f"{name:<6}  {_num(rel, 9)}  {_num(e.norm, 9)}  {_num(e.elementwise, 11)}  "
                     f"{_num(e.ulp, 9, ulp=True)}{flag}")
    for key, side in result.non_finite.items():
        lines.append(f"NON-FINITE: {key} holds NaN or Inf in {side}")
    lines += [f"SPREAD: {f.short()}" for f in result.spread]
    return "\n".join(lines)


def _num(x, width: int, ulp: bool = False) -> str:
    if x is None:
        return f"{'-':>{width}}"
    if ulp and math.isfinite(x) and x < 1e6:
        return f"{int(x):>{width}d}"
    return f"{x:>{width}.2e}"


