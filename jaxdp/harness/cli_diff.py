"""`jaxdp diff A B`: trace A against reference B, the first divergence first (`jaxdp.divergence`), then
the errors per field and the verdict; `--json` and `--html` write the same result as a document and
as a page. Exit status 0 when A agrees with B, 1 when it does not, 2 on bad input."""
from __future__ import annotations

import math
import os

from ..core import argv, atomic, paths
from ..core import trace as trace_mod
from ..core.errors import ConfigError
from . import divergence, parity


def add_parser(sub) -> None:
    diff = argv.subcommand(sub, "diff", help="trace A against reference B: the first divergence, the errors per "
                           "field, judged by the parity bounds", description="Trace A against reference B.")
    diff.add_argument("a", metavar="A", help="the trace to check (.npz)")
    diff.add_argument("b", metavar="B", help="the reference trace (.npz)")
    diff.add_argument("--tolerance", type=float, default=None, metavar="T",
                      help="judge every array's max |a-b| / max |b| against this bound (default: the parity "
                           "bounds for the traces' dtype and optimizer, docs/PARITY.md)")
    diff.add_argument("--no-config-check", dest="config_check", action="store_false",
                      help="compare traces whose meta disagree on configuration fields (lr, steps, ...)")
    diff.add_argument("--json", default=None, metavar="PATH", help="also write the result as JSON here")
    diff.add_argument("--html", default=None, metavar="PATH",
                      help="also write a self-contained page here: heatmap of error / bound, the divergence")


def main(args) -> int:
    for path, flag in ((args.a, "trace A"), (args.b, "trace B")):
        paths.input_file(path, flag)
    for path, flag in ((args.json, "--json"), (args.html, "--html")):
        if path is not None:
            paths.output_file(path, flag)
    if args.tolerance is not None and not (math.isfinite(args.tolerance) and args.tolerance >= 0):
        raise ConfigError(f"--tolerance {args.tolerance}: must be a finite number >= 0; e.g. --tolerance 1e-12")
    a, b = trace_mod.load(args.a), trace_mod.load(args.b)
    report = divergence.compare(a, b, args.tolerance, check_config=args.config_check)
    print(text(report))
    if args.json:
        atomic.write_json(args.json, divergence.as_json(report, args.a, args.b), indent=1, allow_nan=False)
    if args.html:
        from .report import diff_html

        atomic.write_text(args.html, diff_html.page(report, args.a, args.b))
    written = [p for p in (args.json, args.html) if p]
    if written:
        print(f"wrote {' and '.join(os.fspath(p) for p in written)}")
    return int(not report.ok)


def first_line(report: divergence.Report) -> str:
    if report.first is None:
        return "first divergence: none" + ("" if report.ok else " (but see the failures below)")
    more = len(report.divergences) - 1
    tail = f"; {more} more (step, field, tensor) beyond their bounds after it" if more else ""
    return f"first divergence: {report.first.describe()}{tail}"


def relaxed_lines(relaxed: list[str], most: int = 8) -> list[str]:
    """The tensors the error model kept within their bounds, one line each (the first `most`)."""
    more = [f"  ... and {len(relaxed) - most} more (all in --json)"] if len(relaxed) > most else []
    head = [f"within bounds by the error model ({len(relaxed)}: raw error beyond the bound, explained by the "
            f"gradients' roundoff after the optimizer):"] if relaxed else []
    return head + [f"  {r}" for r in relaxed[:most]] + more


def text(report: divergence.Report) -> str:
    """The report: the first divergence and notes, the per-field table, the bounds and the verdict."""
    notes = report.notes + [f"bounds: {report.bounds['source']}"]
    lines = [first_line(report)] + [f"note: {n}" for n in notes]
    lines += relaxed_lines(report.relaxed)
    d, row = report.extra["diff"], report.extra["row"]
    if row is None:
        lines.append(trace_mod.format_diff(d, report.extra["tolerance"]))
    else:
        lines += [trace_mod.format_diff(d), parity.format_tolerance(row.tol, report.bounds["dtype"]),
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
