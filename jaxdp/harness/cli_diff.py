"""`jaxdp diff A B`: trace A against reference B, the first divergence first (`jaxdp.judge.divergence`), then
the errors per field and the verdict (`jaxdp.diff`'s `Verdict`: its `text()`, `to_json()`); `--json`
and `--html` write the same result as a document and as a page. Exit status 0 when A agrees with B,
1 when it does not, 2 on bad input."""
from __future__ import annotations

import math
import os

from ..core.errors import ConfigError
from ..core.files import atomic, paths
from ..core.run import argv
from ..judge import divergence, verdict


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
    diff.add_argument("--json", default=None, metavar="PATH",
                      help="also write the result as JSON here ('-': stdout, the verdict's text then on stderr)")
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
    v = verdict.diff(args.a, args.b, tolerance=args.tolerance, check_config=args.config_check)
    print(v.text())
    if args.json:
        atomic.write_json(args.json, v.to_json(), indent=1, allow_nan=False)
    if args.html:
        from .report import diff_html

        atomic.write_text(args.html, diff_html.page(v.report, args.a, args.b))
    written = [p for p in (args.json, args.html) if p]
    if written:
        print(f"wrote {' and '.join(os.fspath(p) for p in written)}")
    return int(not v.ok)


def text(report: divergence.Report) -> str:
    """What `jaxdp diff` prints for a `jaxdp.judge.divergence.Report` (`Verdict.text()`)."""
    return verdict.render(report)
