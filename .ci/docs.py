"""Every figure in the docs that moves, rendered from the results file the command that measures it writes.
`python3 .ci/docs.py --write` puts each into its page between its markers; `--check` exits 1 naming each
page and block that differs from what its results file renders (tests/house/test_docs_figures.py runs it);
no flag prints which results file feeds which block.

Two kinds of markers: a block (a table, a paragraph) sits between `<!-- gen:NAME -->` and `<!-- /gen:NAME -->`
on lines of their own; a figure inside a sentence between `<!-- fig:NAME -->` and `<!-- /fig -->`. The blocks
that were generated before this command keep their own markers (the layout map, the fused matrix, the
calibration table). A results file not in this checkout renders as a line naming the command that writes it.
"""
from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / ".ci"))

TESTS = "docs/results/tests.json"
CI = "docs/results/ci.json"
BENCH = "docs/results/bench/bench.json"
GPU_TARGET = "docs/results/gpu_target.json"
HONEST = "docs/results/honest.json"
# The honest matrix's renderer, `render(results) -> str` (`python -m tests.mutations.honest --results FILE`
# writes its results file; `honest_render` renders the same block alone)
HONEST_RENDER = "tests.mutations.honest_render:render"
LIMITS = "docs/results/limits.json"  # `python -m tests.mutations.limits` writes it


def load(path: str):
    file = ROOT / path
    return json.loads(file.read_text()) if file.exists() else None


def missing(path: str, command: str) -> str:
    return f"(not measured in this checkout: `{command}` writes `{path}`, then `python3 .ci/docs.py --write`)"


def _call(dotted: str, *args):
    module, name = dotted.split(":")
    return getattr(importlib.import_module(module), name)(*args)


# -- the renderers: each reads its results file (None when absent) and returns the text between the markers

def layout(_=None) -> str:
    import layout as ci_layout  # .ci/layout.py
    body = ci_layout.layout()
    return body[len(ci_layout.START) + 1:-len(ci_layout.END) - 1]


def fused_matrix(results) -> str:
    from jaxdp.harness import fused_matrix_doc
    return fused_matrix_doc.render(results)


def calibration(results) -> str:
    from jaxdp.analysis import calibration_points
    return calibration_points.markdown(results)


def _sig2(x: float) -> str:
    """Two significant figures, written out: 2.0, 20, 130."""
    v = float(f"{x:.2g}")
    return f"{v:.1f}" if v < 10 else f"{v:.0f}"


def links(_=None) -> str:
    """docs/ZERO.md's hsdp table: the compare report's network model (jaxdp/harness/report/links.py) per model,
    strategy and N: communication per step, weak efficiency without / with full overlap."""
    from jaxdp.harness.report import links as model
    rows = model.table()
    ns = sorted({r["n"] for r in rows})
    cells: dict = {}
    for r in rows:
        eff = " / ".join(f"{e:.1f}".rstrip("0").rstrip(".") for e in (r["weak_efficiency"], r["overlapped_efficiency"]))
        cells.setdefault((r["model"], r["strategy"]), {})[r["n"]] = f"{_sig2(r['comm_s'] * 1e3)} ms: {eff}"
    out = ["| model | strategy | " + " | ".join(f"N = {n}" for n in ns) + " |", "|---|---|" + "---|" * len(ns)]
    out += [f"| {m} | {s} | " + " | ".join(c.get(n, "-") for n in ns) + " |" for (m, s), c in cells.items()]
    return "\n".join(out)


def bench(results) -> str:
    if results is None:
        return missing(BENCH, "jaxdp bench --out docs/results/bench")
    markdown = importlib.import_module("jaxdp.harness.bench.markdown")  # the package's `markdown` is a function
    text = markdown.markdown(results).strip()  # its headings one level under the page's "## Results"
    return "\n".join("##" + line if line.startswith("#") else line for line in text.split("\n"))


def gpu_target(results) -> str:
    if results is None:
        return missing(GPU_TARGET, f"python -m jaxdp.harness.bench.gpu_target {GPU_TARGET}")
    from jaxdp.harness.bench import gpu_target as g
    return "\n".join(g.section({"gpu_projection": results})).strip()


def limits(results) -> str:
    if results is None:
        return missing(LIMITS, f"python -m tests.mutations.limits --json {LIMITS}")
    return _call("tests.mutations.limits_doc:render", results)


def honest(results) -> str:
    if results is None:
        return missing(HONEST, f"python -m tests.mutations.honest --results {HONEST}")
    return _call(HONEST_RENDER, results).strip()


UNMEASURED = "(not measured in this checkout)"  # an inline figure whose results file is absent: its page says which


def _tests(results, part: str, key) -> str:
    return UNMEASURED if results is None or results.get(part) is None else str(key(results[part]))


def _ci(results, key) -> str:
    return str(key(results)) if results else UNMEASURED


def tests_run(r) -> str:
    run = r and r.get("run")
    if not run:
        return _tests(r, "run", None)
    skipped = f", {run['skipped']} skipped" if run["skipped"] else ""
    failed = f", {run['failed']} failed" if run["failed"] else ""
    return f"{run['passed']} passed{failed}{skipped} in {run['seconds']} s (at {run['commit']})"


# {name: (page, results file, renderer)}; a name the page marks as a figure renders inline
BLOCKS = {
    "layout": ("docs/LAYOUT.md", None, layout),
    "fused-matrix": ("docs/KERNELS.md", "docs/fused_matrix.json", fused_matrix),
    "calibration": ("docs/GPU.md", "jaxdp/assets/calibration.json", calibration),
    "bench": ("docs/BENCHMARKS.md", BENCH, bench),
    "gpu-target": ("docs/BENCHMARKS.md", GPU_TARGET, gpu_target),
    "honest": ("docs/PARITY.md", HONEST, honest),
    "limits": ("docs/LIMITS.md", LIMITS, limits),
    "links": ("docs/ZERO.md", None, links),
}
FIGURES = {  # {name: (results file, renderer)}: inline, in any page
    "tests.all": (TESTS, lambda r: _tests(r, "collection", lambda c: c["tests"]["all"])),
    "tests.quick": (TESTS, lambda r: _tests(r, "collection", lambda c: c["tests"]["quick"])),
    "tests.slow": (TESTS, lambda r: _tests(r, "collection", lambda c: c["tests"]["slow"])),
    "tests.run": (TESTS, tests_run),
    "honest.passed": (HONEST, lambda r: f"{r['summary']['passed']} of {r['summary']['comparisons']}" if r
                      else UNMEASURED),
    "ci.first": (CI, lambda r: _ci(r, lambda c: f"{c['first_seconds']} s")),
    "ci.tests": (CI, lambda r: _ci(r, lambda c: f"{c['tests_seconds']} s")),
    "ci.total": (CI, lambda r: _ci(r, lambda c: f"{c['total_seconds']} s (at {c['commit']})")),
}
OLD_MARKS = {"layout": ("<!-- layout: start -->", "<!-- layout: end -->"),
             "fused-matrix": ("<!-- fused matrix: start -->", "<!-- fused matrix: end -->"),
             "calibration": ("<!-- calibration-table -->", "<!-- /calibration-table -->"),
             "honest": ("<!-- honest:begin -->", "<!-- honest:end -->"),
             "limits": ("<!-- limits: start -->", "<!-- limits: end -->")}
FIG = re.compile(r"<!-- fig:([\w.-]+) -->(.*?)<!-- /fig -->", re.S)
PAGES = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))


def marks(name: str) -> tuple[str, str]:
    return OLD_MARKS.get(name, (f"<!-- gen:{name} -->", f"<!-- /gen:{name} -->"))


def rendered(page: str, text: str) -> tuple[str, list[str]]:
    """`text` (the page `page`) with every block and figure rendered; the names of those it holds."""
    names = []
    for name, (where, results, render) in BLOCKS.items():
        start, end = marks(name)
        if where != page or start not in text:
            continue
        head, rest = text.split(start, 1)
        if end not in rest:
            raise SystemExit(f"{page}: {start} has no {end}")
        text = f"{head}{start}\n{render(load(results) if results else None)}\n{end}{rest.split(end, 1)[1]}"
        names.append(name)

    def figure(m: re.Match) -> str:
        if m.group(1) not in FIGURES:
            raise SystemExit(f"{page}: unknown figure {m.group(1)!r}; known: {', '.join(FIGURES)}")
        results, render = FIGURES[m.group(1)]
        names.append(m.group(1))
        return f"<!-- fig:{m.group(1)} -->{render(load(results))}<!-- /fig -->"
    return FIG.sub(figure, text), names


def stale() -> list[str]:
    """'page: names' for every page whose blocks or figures differ from their results files."""
    out = []
    for page in PAGES:
        text = (ROOT / page).read_text()
        new, names = rendered(page, text)
        if new != text:
            out.append(f"{page}: {', '.join(names)}")
    return out


def main(argv: list[str]) -> int:
    if "--write" in argv:
        for page in PAGES:
            text = (ROOT / page).read_text()
            new, _ = rendered(page, text)
            if new != text:
                (ROOT / page).write_text(new)
                print(f"wrote {page}")
        return 0
    if "--check" in argv:
        bad = stale()
        for line in bad:
            print(f"{line}: differs from its results file: run python3 .ci/docs.py --write", file=sys.stderr)
        return 1 if bad else 0
    for name, (page, results, _) in BLOCKS.items():
        print(f"{name:14} {page:22} <- {results or 'the source tree'}")
    for name, (results, _) in FIGURES.items():
        print(f"{name:14} {'(inline)':22} <- {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
