"""The `jaxdp diff --html` page: one self-contained file (inline CSS and SVG, nothing fetched) with
a step x tensor heatmap of each error relative to its bound (log colour scale), the first
divergence outlined, and the per-tensor table at its step."""
from __future__ import annotations

import html
import math

from ...judge import divergence

CELL, LABEL, TOP = 16, 260, 40
LOW, HIGH = -8.0, 3.0  # log10(error / bound) from 1e-8 (agreement) to 1e3 (far beyond)
STYLE = """body{font-family:system-ui,sans-serif;margin:24px;color:#222}
.ok{color:#1b5e20}.bad{color:#b71c1c}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td.name{text-align:left;font-family:monospace}
tr.first{background:#fff3c4;font-weight:bold}tr.beyond td.ratio{color:#b71c1c}
svg text{font-family:monospace;font-size:11px}"""


def colour(ratio: float, judged: bool = True) -> str:
    """Light green (error 1e-8 of its bound) to pale yellow (at the bound), then orange to dark red (1e3 x
    beyond); black for non-finite, missing or infinitely beyond; grey when not judged."""
    if not judged:
        return "#e0e0e0"
    if math.isinf(ratio) or math.isnan(ratio):
        return "#000000"
    v = min(max(math.log10(ratio) if ratio > 0 else LOW, LOW), HIGH)
    if v <= 0:
        return _mix((232, 245, 233), (255, 241, 118), (v - LOW) / -LOW)
    return _mix((255, 138, 101), (183, 28, 28), v / HIGH)


def _mix(c0, c1, t: float) -> str:
    return "#" + "".join(f"{round(a + (b - a) * t):02x}" for a, b in zip(c0, c1, strict=True))


def _grid(report: divergence.Report) -> tuple[list[tuple[str, str]], list[int], dict]:
    """Rows (field, name), columns (steps; the first is init) and {(row, step): cell}. Initial
    parameters go to their param row, the initial state to its state row."""
    cells = list(report.cells) + [divergence.Cell(v.step, v.field, v.name, v.measure, v.error, v.bound, math.inf)
                                  for v in report.divergences if v.measure in ("missing", "shape")]
    grid = {}
    for c in cells:
        row = (c.field, c.name)
        if c.field == "init":
            row = ("state", c.name[len("state/"):]) if c.name.startswith("state/") else ("param", c.name)
        grid[(row, c.step)] = c
    order = {f: i for i, f in enumerate(divergence.ORDER)}
    rows = sorted({r for r, _ in grid}, key=lambda r: (order[r[0]], r[1]))
    return rows, list(range(report.first_step - 1, report.steps + 1)), grid


def heatmap(report: divergence.Report) -> str:
    rows, steps, grid = _grid(report)
    first = report.first
    width, height = LABEL + CELL * len(steps) + 10, TOP + CELL * len(rows) + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" id="heatmap">']
    for j, s in enumerate(steps):
        if j == 0 or s % 5 == 0 or len(steps) <= 20:
            label = "init" if j == 0 else str(s)
            out.append(f'<text x="{LABEL + j * CELL + CELL / 2}" y="{TOP - 6}" text-anchor="middle" '
                       f'transform="rotate(-60 {LABEL + j * CELL + CELL / 2} {TOP - 6})">{label}</text>')
    for i, row in enumerate(rows):
        y = TOP + i * CELL
        label = row[1] if row[0] == row[1] else " ".join(row)
        out.append(f'<text x="{LABEL - 4}" y="{y + CELL - 4}" text-anchor="end">{html.escape(label)}</text>')
        for j, s in enumerate(steps):
            c = grid.get((row, s))
            if c is None:
                continue
            judged = c.bound is None or c.measure == "non-finite" or math.isfinite(c.bound)
            tip = f"step {s} {c.field} {c.name}: {c.measure} {c.error:.2e}, bound {c.bound}"
            out.append(f'<rect x="{LABEL + j * CELL}" y="{y}" width="{CELL - 1}" height="{CELL - 1}" '
                       f'fill="{colour(c.ratio, judged)}"><title>{html.escape(tip)}</title></rect>')
    if first is not None and first.name != "(all)":
        row = ("param", first.name) if first.field == "init" and not first.name.startswith("state/") else \
            ("state", first.name[len("state/"):]) if first.field == "init" else (first.field, first.name)
        if row in rows and first.step in steps:
            x, y = LABEL + steps.index(first.step) * CELL, TOP + rows.index(row) * CELL
            out.append(f'<rect id="first" x="{x - 2}" y="{y - 2}" width="{CELL + 3}" height="{CELL + 3}" '
                       f'fill="none" stroke="#1565c0" stroke-width="3"/>')
    out.append("</svg>")
    return "\n".join(out)


def legend() -> str:
    stops = [(LOW, "1e-8"), (-4, "1e-4"), (0, "1 (bound)"), (HIGH, "1e3")]
    parts = [f'<span style="background:{colour(10 ** v)};color:{"#fff" if v > 0 else "#222"};padding:2px 8px;'
             f'margin-right:4px">{t}</span>' for v, t in stops]
    parts += ['<span style="background:#000;color:#fff;padding:2px 8px">non-finite / missing</span>',
              '<span style="background:#e0e0e0;padding:2px 8px;margin-left:4px">not judged</span>']
    return "<p>error / bound: " + "".join(parts) + "</p>"


def step_table(report: divergence.Report) -> tuple[int | None, str]:
    """The table of every tensor at the first divergence's step (or, with none, the step closest to
    its bounds)."""
    _, _, grid = _grid(report)
    if not grid:
        return None, "<p>no arrays to compare</p>"
    cells = list(grid.values())
    step = report.first.step if report.first else max(cells, key=lambda c: c.ratio).step
    head = "<tr><th>field</th><th>tensor</th><th>measure</th><th>error</th><th>bound</th><th>error / bound</th></tr>"
    rows = []
    for c in sorted((c for c in cells if c.step == step), key=lambda c: divergence.ORDER.index(c.field)):
        first = report.first and (c.field, c.name) == (report.first.field, report.first.name)
        cls = "first" if first else ("beyond" if c.ratio > 1 else "")
        rows.append(f'<tr class="{cls}"><td>{c.field}</td><td class="name">{html.escape(c.name)}</td>'
                    f'<td>{c.measure}</td><td>{_num(c.error)}</td><td>{_num(c.bound)}</td>'
                    f'<td class="ratio">{_num(c.ratio)}</td></tr>')
    return step, f'<table id="step-table">{head}{"".join(rows)}</table>'


def _num(x) -> str:
    return "-" if x is None else f"{x:.2e}" if isinstance(x, float) else str(x)


def page(report: divergence.Report, a_path: str = "A", b_path: str = "B") -> str:
    verdict = '<span class="ok">ok</span>' if report.ok else '<span class="bad">MISMATCH</span>'
    first = html.escape(report.first.describe()) if report.first else "none"
    step, table = step_table(report)
    at = "init" if step is not None and step < report.first_step else step
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in report.notes + report.failures)
    relaxed = "".join(f"<li>{html.escape(r)}</li>" for r in report.relaxed)
    relaxed = (f'<h2>Within bounds by the error model ({len(report.relaxed)})</h2><p>Raw error beyond the bound, '
               f'within the allowance each line names (replayed gradients, storage; docs/PARITY.md).</p>'
               f'<ul id="relaxed">{relaxed}</ul>') if relaxed else ""
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>jaxdp diff</title><style>{STYLE}</style></head><body>
<h1>jaxdp diff: {verdict}</h1>
<p>A <code>{html.escape(str(a_path))}</code> against reference B <code>{html.escape(str(b_path))}</code>;
bounds: {html.escape(str(report.bounds.source))}</p>
<h2>First divergence</h2><p id="first-divergence">{first}</p>
<ul>{notes}</ul>
{relaxed}
<h2>Error / bound, step by step</h2>{legend()}
{heatmap(report)}
<h2>Every tensor at step {at}</h2>
{table}
</body></html>
"""
