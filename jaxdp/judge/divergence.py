"""The first divergence of trace A from reference B: the first step, field and tensor beyond its
bound, with the worst element (its index and both values). What `jaxdp diff` prints first, writes
with `--json` and draws with `--html` (docs/TRACE.md).

Order: the values before the first step (`init`: the parameters `init/<name>` and the state
`state/<name>`), then step by step `x`, `y`, `loss`, `grad`, `param`, `state`. Within one step and
field the tensor beyond its bound by the largest factor is named.

The bounds are the judge's (`jaxdp.judge.parity.judge`, whose numbers, from `trace.diff`, are reused
here), applied per step and tensor:
  init, x, y   identical (bit for bit, as the judge requires of the initial parameters)
  loss         |a - b| / |b|                 <= bound.loss
  grad         ||a - b|| / ||b||             <= bound.grad    and elementwise <= bound.elementwise
  param        ||a - b|| / ||b||             <= bound.param, its step's update <= bound.update,
               elementwise <= bound.elementwise, and the step's update over all tensors <= bound.step_update
  state        ||a - b|| / ||b||             <= bound.grad    (state such as running statistics is
                                                               computed like the gradients, from the batch)
With `--tolerance T`: every field's max |a - b| / max |b| <= T (the historical measure). Always: a
NaN or Inf is a divergence, and so is a key that only one trace holds, except a batch (x, y), which
recorders take optionally. A trace's rank spread (jaxdp/core/traces/spread.py) is judged on its own, never compared.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.traces import spread as spread_mod
from ..core.traces import trace as trace_mod
from . import bf16_floor, error_model, parity, precision, relaxed, resolution, resumed, signed
from .judgement import Bounds, Cell, Divergence, Report, ratio  # the result types, also read as divergence.<name>

ORDER = ("init", "x", "y", "loss", "grad", "param", "state")
BATCH = ("x", "y")


def position(key: str, first_step: int = 1) -> tuple[int, str, str] | None:
    """(step, field, name) of a trace key (`trace.parse_key`); init/ and state/ are the step before the
    first (`name` state/<name> for the state); loss, x and y are named by their field; None for a key
    outside the format or one judged elsewhere (a rank spread)."""
    parsed = trace_mod.parse_key(key)
    if parsed is None or parsed.field not in ORDER:
        return None
    if parsed.step is None:
        return first_step - 1, "init", parsed.name if parsed.kind == "init" else key
    return parsed.step, parsed.kind, parsed.name or parsed.kind


def default_bounds(a: trace_mod.Trace, b: trace_mod.Trace) -> tuple[parity.Tolerance, str, str]:
    """The parity bounds for the dtype and optimizer in B's meta (else A's). A user's trace without
    `dtype` is judged by the row of its parameters' dtype (float64, else float32: a bf16 run's
    master values are float32, so name `dtype` or pass --tolerance); without `optimizer` by the Adam
    row, which holds for every optimizer (the same as SGD's in float64 and float32; bf16's judges
    Adam's updates per step only)."""
    meta = {k: m[k] for m in (a.meta, b.meta) for k in ("dtype", "optimizer") if k in m}
    source = []
    if "dtype" not in meta:
        kinds = {np.asarray(v).dtype.name for k, v in b.arrays.items() if position(k) and position(k)[1] == "init"}
        meta["dtype"] = "float64" if kinds == {"float64"} else "float32"
        source.append(f"dtype {meta['dtype']} from the parameters' arrays (meta has no 'dtype')")
    if "optimizer" not in meta:
        meta["optimizer"] = "adam"
        source.append("optimizer row adam, which holds for any optimizer (meta has no 'optimizer')")
    source.append(f"the parity bounds for {meta['dtype']}, {meta['optimizer']}; --tolerance T overrides")
    tol = parity.tolerance({**meta, precision.KEY: precision.merged(a.meta, b.meta)})  # the precision census
    source += [f"losses and gradients at {low}'s roundoff (precision census)"] if (
        low := precision.roundoff_dtype(a.meta, b.meta)) else []
    return tol, meta["dtype"], "; ".join(source)


def compare(a: trace_mod.Trace, b: trace_mod.Trace, tolerance: float | None = None,
            check_config: bool = True) -> Report:
    """A against reference B: the parity bounds (`default_bounds`), or with `tolerance` the relative
    error of every array. Raises TraceError when the configurations (meta fields both carry) differ
    and `check_config`."""
    notes = []
    if check_config:
        trace_mod.check_comparable(a, b)
        shared = trace_mod.shared_config_fields(a, b)
        notes.append(f"configuration compared on {', '.join(shared) or 'no field (neither meta carries one)'}")
    notes += [k] if (k := parity.kernels_note(a, b)) else []  # which kernels each side ran
    notes += [p] if (p := precision.line(a.meta, b.meta)) and tolerance is None else []  # lower-precision sites
    found, a, b = spread_mod.split(a, b, ("A", "B"))
    a, b, shared = resumed.align(a, b)
    notes += [shared] if shared else []
    first_step = a.first_step
    pos = {k: p for k in set(a.arrays) | set(b.arrays) if (p := position(k, first_step))}
    outside = sorted((set(a.arrays) | set(b.arrays)) - set(pos))
    if outside:
        notes.append(f"ignored {len(outside)} keys outside the trace format, e.g. {outside[0]}")
    divergences = _missing(a, b, pos, notes)
    common = [k for k in pos if k in a.arrays and k in b.arrays]
    same_shape = [k for k in common if np.shape(a.arrays[k]) == np.shape(b.arrays[k])]
    divergences += [Divergence(*pos[k], k, "shape", math.inf, None,
                               detail=f"{k} has shape {np.shape(a.arrays[k])} in A, {np.shape(b.arrays[k])} in B")
                    for k in common if k not in same_shape]
    steps = min(a.steps, b.steps)
    tol, dtype, source = default_bounds(a, b) if tolerance is None else (None, None, "--tolerance")
    ra, rb = (_restricted(t, same_shape, first_step, steps, dtype) for t in (a, b))
    if tolerance is None:
        row = parity.judge(ra, rb, tol, sides=("A", "B"), check_config=False, with_ulp=True)
        d, failures = row.diff, spread_mod.failures(found) + row.failures  # a rank spread first: it explains the rest
        measures = _bounded(d, tol, pos, same_shape, row.resolution)
        step_update = dict(zip(range(first_step, steps + 1), row.per_step["step update"], strict=False))
        bounds = Bounds({f: tol.bound(f) for f in parity.FIELDS + ("elementwise",)}, source, dtype)
    else:
        row, failures, step_update = None, spread_mod.failures(found), {}
        d = trace_mod.diff(ra, rb, check_config=False, with_ulp=False)
        measures = {k: [("relative", d.per_array[k], tolerance)] for k in same_shape}
        bounds = Bounds({"relative": tolerance}, "--tolerance")
    cells, beyond = _cells(d, measures, pos)
    divergences += beyond + _step_updates(step_update, tol, d.norm)
    divergences += _grad_scales(ra, rb, d.norm) if tolerance is None else []
    divergences.sort(key=lambda v: (v.step, ORDER.index(v.field), -v.ratio, v.name))
    first = divergences[0] if divergences else None
    allow = row.allowance if row is not None else None
    if first is not None and first.measure in resolution.MEASURES:
        _located(first, a, b, row.resolution)
    elif first is not None and first.key in a.arrays and first.key in b.arrays and not first.detail:
        _locate(first, a, b, first_step, d.floor, allow)
    note, kept = relaxed.lines(row) if row is not None else ("", [])
    settings = error_model.why_none(ra, rb) if row is not None and dtype in error_model.DTYPES else None
    notes += list(dict.fromkeys(n for n in (note, settings) if n)) + spread_mod.notes(found)  # said once
    ok = not divergences and not failures
    return Report(ok, first, divergences, cells, failures, notes, bounds, first_step=first_step, steps=steps,
                  relaxed=kept, diff=d, row=row, tolerance=tolerance, spread=found,
                  precision=precision.to_json(a.meta, b.meta))


def _missing(a, b, pos, notes) -> list[Divergence]:
    out, batch = [], []
    for side, have, lack in (("b", a, b), ("a", b, a)):
        for k in sorted(set(have.arrays) - set(lack.arrays)):
            if k not in pos:
                continue
            if pos[k][1] in BATCH:
                batch.append(k)
            else:
                out.append(Divergence(*pos[k], k, "missing", math.inf, None, missing=side))
    if batch:
        notes.append(f"batches recorded by one side only are not compared ({len(batch)}, e.g. {batch[0]})")
    return out


def _restricted(t, keys, first_step, steps, dtype) -> trace_mod.Trace:
    """`t` holding only `keys` up to `steps`, its meta's step range the shared one, its dtype the
    bounds' (which sets the elementwise floor)."""
    kept = {k: t.arrays[k] for k in keys if (step := trace_mod.parse_key(k).step) is None or step <= steps}
    return trace_mod.Trace({**({"dtype": dtype} if dtype else {}), **t.meta, "steps": steps, "first_step": first_step},
                           kept)


def _bounded(d: trace_mod.TraceDiff, tol, pos, keys, derived=None) -> dict:
    """key -> [(measure, error, bound)] under the parity bounds (module docstring), a parameter's
    update also under its bounds derived from the traces (`derived`, jaxdp/judge/resolution.py)."""
    out = {}
    extra = {}
    for f in derived.cells if derived else ():
        extra.setdefault(f"step/{f.step}/param/{f.name}", []).append((f.measure, f.error, f.bound))
    for k in keys:
        step, fld, name = pos[k]
        if fld in ("init",) + BATCH:
            out[k] = [("identical", d.per_array[k], 0.0)]
        elif fld == "loss":
            out[k] = [("norm", d.norm[k], tol.loss)]
        elif fld == "state":
            out[k] = [("norm", d.norm[k], tol.grad)]
        else:
            out[k] = [("norm", d.norm[k], tol.bound(fld)), ("elementwise", d.elementwise[k], tol.elementwise)]
            if fld == "param" and f"update/{step}/{name}" in d.norm:
                out[k].append(("update", d.norm[f"update/{step}/{name}"], tol.update))
            out[k] += extra.get(k, [])
    return out


def _cells(d: trace_mod.TraceDiff, measures, pos) -> tuple[list[Cell], list[Divergence]]:
    """One cell per key (its measure beyond its bound by the largest factor) and the divergences."""
    cells, beyond = [], []
    for k in sorted(measures, key=lambda k: (pos[k][0], ORDER.index(pos[k][1]), pos[k][2])):
        step, fld, name = pos[k]
        if k in d.non_finite:
            worst = ("non-finite", math.inf, measures[k][0][2])
        else:
            worst = max(measures[k], key=lambda m: ratio(m[1], m[2]))
        cell = Cell(step, fld, name, *worst, math.inf if worst[0] == "non-finite" else ratio(worst[1], worst[2]))
        cells.append(cell)
        if cell.ratio > 1:
            beyond.append(Divergence(step, fld, name, k, worst[0], worst[1], worst[2]))
    return cells, beyond


def _step_updates(step_update: dict, tol, norm: dict) -> list[Divergence]:
    """A step whose update over all tensors is beyond bound.step_update, named by its tensor with the
    largest update error (Adam in bf16 is judged only this way)."""
    out = []
    for step, err in step_update.items():
        if err > tol.step_update:
            keys = {k: p for k in norm if (p := trace_mod.parse_key(k)) and p.kind == "update" and p.step == step}
            updates = {p.name: norm[k] for k, p in keys.items()}
            name = max(updates, key=lambda n: (updates[n], n)) if updates else "(all)"
            out.append(Divergence(step, "param", name, f"step/{step}/param/{name}", "step update", err,
                                  tol.step_update))
    return out


def _grad_scales(a, b, norm: dict) -> list[Divergence]:
    """bf16: a step whose gradients, all tensors together, are off B's by a factor (`bf16_floor.scale_steps`), named
    by its tensor with the largest gradient error."""
    out = []
    for step, s in bf16_floor.scale_steps(a, b):
        errs = {p.name: norm[k] for k in norm if (p := trace_mod.parse_key(k)) and p.kind == "grad" and p.step == step}
        name = max(errs, key=lambda n: (errs[n], n)) if errs else "(all)"
        out.append(Divergence(step, "grad", name, f"step/{step}/grad/{name}", "grad scale", abs(s - 1),
                              bf16_floor.SCALE_BOUND, detail=f"<g_a, g_b> / ||g_b||^2 = {s:.3g} over the step"))
    return out


def _located(v: Divergence, a, b, derived) -> None:
    """Fill in a derived bound's divergence: the element the resolution names (the tensor's worst
    element for 'resolved update') and both sides' parameters there."""
    element = next((f for f in derived.cells if (f.step, f.name, f.measure) == (v.step, v.name, "resolved element")),
                   None)
    if element is not None and element.index is not None:
        v.index = element.index
        v.a, v.b = (float(np.asarray(t.arrays[v.key], np.float64)[element.index]) for t in (a, b))
        v.allowance = element.why if v.measure != signed.MEASURE else (
            f"its elements may each be within their storage roundoff, but summed along the update over the steps "
            f"so far they show a scale {v.error:.1e} of it, beyond the {v.bound:.1e} storage rounding can make "
            f"(a learning rate or a scale on this tensor?)")


def _locate(v: Divergence, a, b, first_step: int, floor: float, allow=None) -> None:
    """Fill in the worst element of the divergence `v`: its index and both values, scored beyond the
    error model's allowances, and the allowance there when it has one."""
    xa, xb = (np.asarray(t.arrays[v.key], np.float64) for t in (a, b))
    update_key = f"update/{v.step}/{v.name}"
    allowed = allow.of(update_key if v.measure in ("update", "step update") else v.key) if allow else None
    bad = ~(np.isfinite(xa) & np.isfinite(xb))
    with np.errstate(invalid="ignore", over="ignore"):
        if bad.any():
            score = bad.astype(np.float64)
        elif v.measure in ("update", "step update"):
            before = f"init/{v.name}" if v.step == first_step else f"step/{v.step - 1}/param/{v.name}"
            pa, pb = (np.asarray(t.arrays.get(before, 0.0), np.float64) for t in (a, b))
            score = error_model.excess(xa - pa, xb - pb, allowed)
        elif v.measure == "elementwise":
            score = error_model.excess(xa, xb, allowed) / np.maximum(np.abs(xb), floor)
        else:
            score = error_model.excess(xa, xb, allowed)
    if score.size:
        index = np.unravel_index(int(np.argmax(score)), score.shape)
        v.index, v.a, v.b = tuple(int(i) for i in index), float(xa[index]), float(xb[index])
        if allowed is not None and float(allowed[index]) > 0 and not bad.any():
            g_a, g_b = (allow.grads.get((s, v.step, v.name)) for s in ("a", "b"))
            if g_a is not None and g_b is not None:
                stored = error_model.storage(b, f"step/{v.step}/param/{v.name}") \
                    if v.measure in ("update", "step update") else 0.0
                v.allowance = relaxed.why(allow.opt, float(g_a[index]), float(g_b[index]),
                                          float(np.max(np.abs(g_b))), float(allowed[index]),
                                          float(np.abs(xa - xb)[index]), ("A", "B"),
                                          float(np.broadcast_to(stored, np.shape(xb))[index]))
