"""The detection-limit table of docs/LIMITS.md, rendered from the results file that
`python -m tests.mutations.limits` writes (docs/results/limits.json): a row per family and tensor
kind, per dtype the smallest learning-rate error (relative), one element's error (absolute) and gradient
error (relative) the judge fails, with the tensor measured. `render` is what the docs hold between the
limits markers (tests/mutations/test_limits_doc.py checks it)."""
from __future__ import annotations

import json
import math

BUGS = ("lr", "element", "grad")
KINDS = ("kernel", "bias", "norm scale", "embedding")
START, END = "<!-- limits: start -->", "<!-- limits: end -->"


def load(path: str = "docs/results/limits.json") -> dict:
    with open(path) as f:
        return json.load(f)


def _d(x: float) -> str:
    return "not caught" if not math.isfinite(x) else f"{x:.0e}"


def render(results: dict) -> str:
    """The markdown table of `results` (module docstring), dtypes as column groups, in the file's order."""
    dtypes = list(dict.fromkeys(r["dtype"] for r in results["rows"]))
    by = {(r["family"], r["dtype"]): r for r in results["rows"]}
    families = list(dict.fromkeys(r["family"] for r in results["rows"]))
    head = "| family | kind (tensor measured) | " + " | ".join(
        f"{d}: lr 1 + d | {d}: one element + d | {d}: gradient 1 + d" for d in dtypes) + " |"
    lines = [f"Measured by `{results['command']}` ({results['optimizer']}; {results.get('wall_s', 0) / 60:.1f} "
             f"min); honest pairs: " + ", ".join(f"{f} {d} {'pass' if by[f, d]['honest_ok'] else 'FAIL'}"
                                                 for f in families for d in dtypes if (f, d) in by) + ".", "",
             head, "|" + "---|" * (2 + 3 * len(dtypes))]
    for family in families:
        for kind in KINDS:
            cells = [by.get((family, d), {}).get("kinds", {}).get(kind) for d in dtypes]
            if not any(cells):
                continue
            tensor = next(c["tensor"] for c in cells if c)
            values = [_d(c[bug]) if c else "-" for c in cells for bug in BUGS]
            lines.append(f"| {family} | {kind} (`{tensor}`) | " + " | ".join(values) + " |")
    return "\n".join(lines)


def section(doc: str) -> str:
    """The text between the limits markers of a document ('' when it has none)."""
    if START not in doc or END not in doc:
        return ""
    return doc.split(START, 1)[1].split(END, 1)[0].strip("\n")
