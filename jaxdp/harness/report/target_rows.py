"""compare --target's own rows: each strategy's step compiled for the target GPU (its peak: compiled) and its
projected step time and MFU (`analysis.calibration`: ranges from the calibration points, never one bold number;
docs/GPU.md, "Projected step time and MFU")."""
from __future__ import annotations

import html

from ...analysis.calibration import PARTS, span
from .units import nbytes

HEADER = ["strategy", "GPUs (nodes)", "peak (compiled)", "fits", "step ms (projected range)", "MFU % (projected)",
          "calibrated on"]


def rows(summary) -> list[list[str]]:
    out = []
    for e in summary["strategies"]:
        t = e.get("target")
        if not t or "projection" not in t:
            continue
        p = t["projection"]
        mfu = p["mfu"] * p["step_s"]
        out.append([e["name"], f"{t['devices']} ({t['nodes']})", nbytes(t["peak_bytes"]), "yes" if t["fits"] else "NO",
                    span(p["step_low_s"], p["step_high_s"], 1e3), span(mfu / p["step_high_s"], mfu / p["step_low_s"],
                                                                      100), ", ".join(p["calibrated_on"]) or "-"])
    return out


def notes() -> list[str]:
    return [f"{k}: {v}" for k, v in PARTS.items()]


def markdown(summary, table_md) -> list[str]:
    found = rows(summary)
    if not found:
        return []
    name = summary["target"]["name"].upper()
    return ["", f"## Compiled for the {name}", "", *table_md(HEADER, found), ""] + [f"- {n}" for n in notes()]


def as_html(summary, table_html) -> str:
    found = rows(summary)
    if not found:
        return ""
    items = "".join(f"<li>{html.escape(n)}</li>" for n in notes())
    return (f"<h2>Compiled for the {html.escape(summary['target']['name'].upper())}</h2>"
            f"{table_html('target', HEADER, found)}<ul class=\"small\">{items}</ul>")
