"""`jaxdp.diff(a, b)`: trace A against reference B as a value, the `Verdict` (docs/LIBRARY.md, "jaxdp.diff:
the verdict as a value"). `jaxdp diff A B` prints its `text()` and writes its `to_json()`; there is no
other code path.

    v = jaxdp.diff("torch.npz", "jax.npz")
    if not v.ok:
        print(v.first.describe())       # step, field, tensor, worst element, both values
    print(v.text())                     # what `jaxdp diff` prints
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field

from ..core.errors import ConfigError
from ..core.files import paths
from ..core.traces import trace as trace_mod
from . import divergence, parity

MOST_RELAXED = 8  # relaxed tensors listed one per line in `text()` when there is no divergence


@dataclass
class Verdict:
    """The judgement of trace A against reference B.

    ok        A agrees with B: no divergence and no failure.
    first     the first divergence (`divergence.Divergence`: step, field, name, index, a, b), or None.
    findings  every (step, field, tensor) beyond its bound, in order, the first first.
    failures  the judge's failures, in words (a field's worst error over its bound, a rank spread...).
    relaxed   what the error model kept within its bounds (`relaxed.Relaxed` / `GradRelaxed`, each
              with `describe()`): raw error beyond the bound, within the error model's allowance (each says which part).
    notes     how it was judged: the configuration fields compared, the steps, the error model.
    bounds    the bounds per measure, the dtype and where they came from (`judgement.Bounds`).
    steps     (first, last): the steps judged (those both traces hold; a resumed trace starts later).
    """
    ok: bool
    first: divergence.Divergence | None
    findings: list
    failures: list
    relaxed: list
    notes: list
    bounds: divergence.Bounds
    steps: tuple
    a: str = ""
    b: str = ""
    report: divergence.Report | None = field(default=None, repr=False)  # cells and numbers, for --html

    @classmethod
    def of(cls, report: divergence.Report, a: str = "", b: str = "") -> Verdict:
        row = report.row
        return cls(report.ok, report.first, list(report.divergences), list(report.failures),
                   list(row.relaxed) if row is not None else [], list(report.notes), report.bounds,
                   (report.first_step, report.steps), os.fspath(a), os.fspath(b), report)

    def text(self) -> str:
        """What `jaxdp diff` prints: the first divergence, the notes, the relaxed tensors (a count after
        a divergence), the errors per field, the bounds and ok or MISMATCH with the failures."""
        return render(self.report)

    def to_json(self) -> dict:
        """The `--json` document (docs/TRACE.md): strict JSON, non-finite numbers as 'nan', 'inf', '-inf'."""
        return as_json(self.report, self.a, self.b)


def diff(a, b, *, tolerance: float | None = None, check_config: bool = True) -> Verdict:
    """Trace `a` against reference `b` (each a `jaxdp.trace.Trace` or a path to a trace file), judged
    by the parity bounds for their dtype and optimizer (docs/PARITY.md), or with `tolerance` by one
    relative bound on every array. Raises `jaxdp.trace.TraceError` (a ValueError) when the traces ran
    different configurations (`check_config=False` compares anyway) or a file cannot be read."""
    if tolerance is not None and not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance)
                                      and tolerance >= 0):
        raise ConfigError(f"tolerance {tolerance!r}: must be a finite number >= 0; e.g. tolerance=1e-12")
    traces = []
    for t, flag in ((a, "trace A"), (b, "trace B")):
        if not isinstance(t, trace_mod.Trace):
            paths.input_file(t, flag)
            t = trace_mod.load(t)
        traces.append(t)
    report = divergence.compare(*traces, tolerance, check_config=check_config)
    return Verdict.of(report, a if not isinstance(a, trace_mod.Trace) else "",
                      b if not isinstance(b, trace_mod.Trace) else "")


def first_line(report: divergence.Report) -> str:
    if report.first is None:
        return "first divergence: none" + ("" if report.ok else " (but see the failures below)")
    more = len(report.divergences) - 1
    tail = f"; {more} more (step, field, tensor) beyond their bounds after it" if more else ""
    return f"first divergence: {report.first.describe()}{tail}"


def relaxed_lines(report: divergence.Report, most: int = MOST_RELAXED) -> list[str]:
    """The tensors the error model kept within their bounds: one line each (the first `most`) when
    nothing diverged; after a divergence, one line with their count (each is in --json)."""
    relaxed = report.relaxed
    if not relaxed:
        return []
    what = "raw error beyond the bound, within the allowance each line names (replayed gradients, storage)"
    if report.first is not None:
        return [f"within bounds by the error model: {len(relaxed)} tensors ({what}; each in --json's "
                f"\"relaxed\", Verdict.relaxed)"]
    more = [f"  ... and {len(relaxed) - most} more (all in --json)"] if len(relaxed) > most else []
    return [f"within bounds by the error model ({len(relaxed)}: {what}):"] + [f"  {r}" for r in relaxed[:most]] + more


def render(report: divergence.Report) -> str:
    """`Verdict.text()` of a `divergence.Report`."""
    notes = report.notes + [f"bounds: {report.bounds.source}"]
    lines = [first_line(report)] + [f"note: {n}" for n in notes]
    lines += relaxed_lines(report)
    d, row = report.diff, report.row
    if row is None:
        lines.append(trace_mod.format_diff(d, report.tolerance))
    else:
        lines += [trace_mod.format_diff(d), parity.format_tolerance(row.tol, report.bounds.dtype),
                  f"step update (all tensors) worst {max(row.per_step['step update'], default=0.0):.2e}"]
    judged = set(report.failures)
    extra = [v.describe() for v in report.divergences if v.measure in ("missing", "shape", "identical")
             or v.field == "state" and not math.isinf(v.error)]
    failures = report.failures + [e for e in extra if e not in judged]
    if report.ok:
        lines.append("ok")
    else:
        failures = failures or [v.describe() for v in report.divergences[:10]] + (
            [f"... and {len(report.divergences) - 10} more"] if len(report.divergences) > 10 else [])
        lines.append("MISMATCH:\n  " + "\n  ".join(failures))
    return "\n".join(lines)


def as_json(report: divergence.Report, a_path: str = "", b_path: str = "") -> dict:
    """The `--json` document: `ok`, `first_divergence` (or None) and the rest (docs/TRACE.md).
    Non-finite numbers are written as the strings 'nan', 'inf', '-inf' (JSON has none)."""
    first = None
    if report.first is not None:
        first = asdict(report.first)
        first["index"] = list(first["index"]) if first["index"] is not None else None
    doc = {"ok": report.ok, "first_divergence": first, "a": os.fspath(a_path), "b": os.fspath(b_path),
           "bounds": report.bounds.to_json(), "failures": report.failures, "notes": report.notes,
           "steps": [report.first_step, report.steps], "relaxed": report.relaxed, "relaxed_count": len(report.relaxed),
           "spread": [asdict(f) for f in report.spread],
           "precision": report.precision,
           "divergences": [{k: getattr(v, k) for k in ("step", "field", "name", "measure", "error", "bound")}
                           for v in report.divergences],
           "table": [asdict(c) for c in report.cells]}
    return _finite(doc)


def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
