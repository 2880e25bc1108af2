"""The compare report as one self-contained HTML page (images embedded, no network) and as
Markdown with the same content (images as files beside it)."""
from __future__ import annotations

import base64
import html
import json
import os

from . import plots

NOTES = [
    "Times are wall-clock on the machine named above. On simulated CPU devices all 'devices' share the same "
    "cores, so absolute times and JAX/torch ratios say little about GPUs; communication bytes and memory do not "
    "depend on the machine.",
    "JAX communication is read from the compiled step's HLO (XLA may combine several collectives into one op: "
    "counted by bytes, not by ops); torch's is counted from what the process group ran.",
    "zero3 in JAX: the program gathers parameters again for backward, but XLA:CPU merges that re-gather with the "
    "forward one, so the executed program sends zero2's bytes, not the 1.5x-DDP theory (docs/STRATEGIES.md).",
    "torch zero1 is ZeroRedundancyOptimizer, which partitions whole parameters (none is split) and broadcasts "
    "updated parameters from their owners; JAX's zero1 shards every parameter flat (padded to a multiple of N). "
    "Per-device optimizer memory therefore differs between the two by the partition's imbalance.",
    "The projection uses this run's model: for a toy model, a ring's per-hop latency dwarfs its compute and the "
    "projected efficiencies are tiny. Project a real workload with a larger --model gpt configuration.",
    "gloo has no native reduce-scatter: torch's reduce-scatter runs as an all-reduce underneath and is counted "
    "as what runs (twice the ideal bytes).",
]


def _kib(b) -> str:
    return "-" if b is None else f"{b / 1024:.1f}"


def _rows(summary) -> list[list[str]]:
    rows = []
    for e in summary["strategies"]:
        j, t = e["frameworks"]["jax"], e["frameworks"]["torch"]
        p = e["parity"]
        theory_comm = e["theory"].get("comm", {}).get("total")
        rows.append([
            e["name"],
            "pass" if p["pass"] else "FAIL",
            f"{p['worst']['grad']:.1e} / {p['worst']['param']:.1e}",
            f"{1e3 * j['median_step_s']:.2f} / {1e3 * t['median_step_s']:.2f}",
            f"{j['compile_s']:.2f} / {t['compile_s']:.2f}",
            f"{_kib(j['comm']['total'])} / {_kib(t.get('comm', {}).get('total'))} / {_kib(theory_comm)}",
            f"{_kib(sum(j['memory'].values()))} / {_kib(sum(t['memory'].values()) if t.get('memory') else None)} / "
            f"{_kib(sum(e['theory']['memory'].values()))}",
        ])
    return rows


HEADER = ["strategy", "parity", "worst grad / param rel. diff", "step ms (JAX / torch, median)",
          "first step s (JAX / torch)", "comm KiB/device/step (JAX / torch / theory)",
          "state KiB/device (JAX / torch / ZeRO formula)"]


def _title(summary) -> str:
    c = summary["config"]
    return (f"jaxdp compare: {c['model']}/{c['data']}, {summary['devices']} devices, {c['steps']} steps, "
            f"batch {c['batch_size']}, {c['optimizer']}, {c['dtype']}")


def _config_line(summary) -> str:
    m = summary["machine"]
    return (f"Machine: {m['platform']} ({m['processor']}, {m['cpu_count']} cores); versions: "
            + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + f". Created {summary['created']}.")


def _preset(summary) -> dict:
    return next(iter(summary["projection"].values()))["preset"]


def html_page(summary, images: dict[str, bytes]) -> str:
    e = html.escape
    rows = "".join("<tr>" + "".join(f"<td class='{'fail' if c == 'FAIL' else ''}'>{e(c)}</td>" for c in r) + "</tr>"
                   for r in _rows(summary))
    figs = "".join(f"<figure><img alt='{e(name)}' src='data:image/png;base64,{base64.b64encode(data).decode()}'>"
                   f"</figure>" for name, data in images.items())
    preset = _preset(summary)
    preset_rows = "".join(f"<tr><td>{e(k)}</td><td>{e(str(v))}</td></tr>" for k, v in preset.items() if k != "sources")
    notes = "".join(f"<li>{e(n)}</li>" for n in NOTES)
    torch_notes = sorted({n for s in summary["strategies"] for n in s["frameworks"]["torch"].get("notes", [])})
    notes += "".join(f"<li>torch: {e(n)}</li>" for n in torch_notes)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{e(_title(summary))}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1150px; color: #222; }}
h1 {{ font-size: 22px; }} h2 {{ font-size: 17px; margin-top: 28px; }}
table {{ border-collapse: collapse; font-size: 13px; margin: 8px 0; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; }}
th {{ background: #f2f2f2; }} td.fail {{ color: #b00; font-weight: bold; }}
figure {{ margin: 12px 0; }} img {{ max-width: 100%; border: 1px solid #eee; }}
.small {{ font-size: 12px; color: #555; }}
</style></head><body>
<h1>{e(_title(summary))}</h1>
<p class="small">{e(_config_line(summary))}
Parity tolerance: {summary["tolerance"]:g} ({e(summary["tolerance_why"])}).</p>
<h2>Verdict</h2>
<table id="verdict"><tr>{"".join(f"<th>{e(h)}</th>" for h in HEADER)}</tr>{rows}</table>
<h2>Figures</h2>
{figs}
<h2>Projection presets</h2>
<table id="presets"><tr><th>preset</th><th>value</th></tr>{preset_rows}</table>
<p class="small">Sources: {e(preset["sources"])}
FLOPs per sample (XLA cost analysis): {summary["flops_per_sample"]:.3g}.</p>
<h2>Notes</h2><ul>{notes}</ul>
<div id="status"></div>
<script>
window.addEventListener('load', function () {{
  var imgs = Array.from(document.images);
  var ok = imgs.filter(function (i) {{ return i.complete && i.naturalWidth > 0; }}).length;
  document.getElementById('status').textContent = 'images ' + ok + '/' + imgs.length +
    ', tables ' + document.querySelectorAll('table tr').length + ' rows';
}});
</script>
</body></html>
"""


def markdown(summary, image_files: list[str]) -> str:
    lines = [
        f"# {_title(summary)}",
        "",
        _config_line(summary),
        "",
        f"Parity tolerance: {summary['tolerance']:g} ({summary['tolerance_why']}).",
        "",
        "## Verdict",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(r) + " |" for r in _rows(summary)]
    lines += ["", "## Figures", ""] + [f"![{name}]({name})" for name in image_files]
    preset = _preset(summary)
    lines += ["", "## Projection presets", "", "| preset | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in preset.items() if k != "sources"]
    lines += [
        "",
        f"Sources: {preset['sources']} FLOPs per sample (XLA cost analysis): {summary['flops_per_sample']:.3g}.",
        "",
        "## Notes",
        "",
    ] + [f"- {n}" for n in NOTES]
    return "\n".join(lines) + "\n"


def write(summary, out: str) -> dict:
    os.makedirs(out, exist_ok=True)
    paths = plots.draw_all(summary, out)
    images = {os.path.basename(p): open(p, "rb").read() for p in paths}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(out, "report.html"), "w") as f:
        f.write(html_page(summary, images))
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(markdown(summary, list(images)))
    return {
        "html": os.path.join(out, "report.html"),
        "md": os.path.join(out, "report.md"),
        "json": os.path.join(out, "summary.json"),
        "images": paths,
    }
