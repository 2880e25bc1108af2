"""The compare report as one self-contained HTML page (images embedded, no network) and as
Markdown with the same content (images as files beside it)."""
from __future__ import annotations

import base64
import html
import json
import os

from ...core.files import atomic
from ...core.registry import strategies as registry
from . import paths, plots, projection, recommend, target_rows
from .units import efficiency, nbytes, si

NOTES = [
    "Step times: each framework's training run, timed step by step with time.perf_counter (JAX: jaxdp.train.run, "
    "the step waited for with float(loss); torch: torch_ref.train.train_rank, whose train_step returns the "
    "loss as a float, and on a GPU torch.cuda.synchronize), without the profiler. torch.profiler runs only in the "
    "separate accounting steps that count the bytes sent and the in-step peak; their times are not shown.",
    "Times are wall-clock on the machine named above. On simulated CPU devices all 'devices' share the same "
    "cores, so absolute times and JAX/torch ratios say little about GPUs; communication bytes and memory do not "
    "depend on the machine.",
    "JAX communication is read from the compiled step's HLO (XLA may combine several collectives into one op: "
    "counted by bytes, not by ops).",
    "zero3 in JAX: each unit's parameters are gathered before its forward and again before its backward, in the "
    "compiled step too (the 1.5x-DDP theory); the bytes shown are those of the collectives in the compiled "
    "step's HLO (docs/STRATEGIES.md).",
    "The projection is for named reference models (GPT-2 124M, Llama 3 8B, from their published shapes) with each "
    "strategy's bytes per parameter in this run's dtype (float32 sends 4-byte gradients; bf16 halves them), "
    "measured when the run had more than one device, else the ring theory's. The run's own model is projected "
    "only when compute-bound: a toy model's microseconds of compute against a ring's latencies would give "
    "efficiencies near 1e-5, which say nothing.",
    "State is what a device holds between steps (parameters, gradients as the update sees them, optimizer "
    "state); peak is the most it needs during a step. JAX: arguments + temporaries + outputs not aliased to "
    "arguments, from the compiled step's memory_analysis(). torch: the tensors a rank holds at the step's start "
    "plus the highest rise of the profiler's memory events (allocations minus frees) during the step (on a GPU, "
    "the allocator's max_memory_allocated); torch's peak also counts what its kernels allocate and free inside.",
]  # the torch side's own notes follow (`_notes`): how torch's bytes are counted, zero1's partition, gloo's
#    reduce-scatter; none is said twice


LINKS_NOTE = (
    "Links model: every collective priced as NCCL runs it on the network as built (jaxdp/analysis/network.py, the "
    "one network model of the project, each constant sourced there): a 1-D ring (ddp, zero3) spans all N GPUs, on "
    "NVLink (450 GB/s per GPU) inside one node of 8 and past it across all 8 NICs of each node (8 x 400 Gb/s = "
    "400 GB/s a node, one NCCL channel per NIC), so crossing nodes costs little bandwidth; an all-reduce across "
    "nodes may take NCCL's tree (in-node reduction first) when faster; NCCL's latencies per step. hsdp with S = 8 "
    "gathers and reduce-scatters on NVLink inside a node and all-reduces Psi / 8 across the N / 8 nodes, one NIC "
    "per GPU. The table's rows are the projection's (the run's dtype; one sequence per GPU, compute at the "
    "preset's assumed MFU), with the full-overlap bound beside them; the published point alone is set in mixed "
    "precision as that run trained (2-byte gathered parameters, 4-byte reduced gradients). The projection adds "
    "compute and communication (no overlap, a lower bound on efficiency); every efficiency is modelled, printed "
    "to one significant figure (docs/GPU.md, \"The range\").")


def _rows(summary) -> list[list[str]]:
    rows = []
    for e in summary["strategies"]:
        j, t = e["frameworks"]["jax"], e["frameworks"]["torch"]
        p = e["parity"]
        theory_comm = e["theory"].get("comm", {}).get("total")
        rows.append([
            e["name"],
            ("pass" if p["pass"] else "FAIL") + finding(e),
            f"{p['worst']['grad']:.1e} / {p['worst']['param']:.1e}",
            f"{1e3 * j['median_step_s']:.2f} / {1e3 * t['median_step_s']:.2f}",
            f"{j['first_step_s']:.2f} / {t['first_step_s']:.2f}",
            f"{nbytes(j['comm']['total'])} / {nbytes(t.get('comm', {}).get('total'))} / {nbytes(theory_comm)}",
            f"{nbytes(sum(j['memory'].values()))} / {nbytes(sum(t['memory'].values()) if t.get('memory') else None)} / "
            f"{nbytes(sum(e['theory']['memory'].values()))}",
            f"{nbytes(j.get('peak_bytes'))} / {nbytes(t.get('peak_bytes'))}",
        ])
    return rows


def finding(entry) -> str:
    """A difference from `single` that the configuration makes on purpose (local BatchNorm)."""
    v = entry.get("vs_single")
    if not v:
        return ""
    how = f"worst grad {v['worst']['grad']:.1e} from single" if v["differs"] else "yet equal to single here"
    return f"; {v['finding']} ({how})"


HEADER = ["strategy", "parity", "worst grad / param rel. diff", "step ms (JAX / torch, median)",
          "first step s (JAX / torch)", "comm per device per step (JAX / torch / theory)",
          "state per device (JAX / torch / ZeRO formula)", "in-step peak per device (JAX / torch)"]


def _title(summary) -> str:
    c = summary["config"]
    return (f"jaxdp compare: {c['model']}/{c['data']}, {summary['devices']} devices, {c['steps']} steps, "
            f"batch {c['batch_size']}, {c['optimizer']}, {c['dtype']}, kernels {c.get('kernels', 'mirrored')}"
            + (" (torch compiled)" if c.get("compile") else ""))


def _config_line(summary) -> str:
    m = summary["machine"]
    return (f"Machine: {m['platform']} ({m['processor']}, {m['cpu_count']} cores); versions: "
            + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + f". Created {summary['created']}.")


def _count(x: float) -> str:
    return f"{x / 1e9:.2f}B" if x >= 1e9 else f"{x / 1e6:.1f}M" if x >= 1e6 else f"{x:,.0f}"


PROJECTION_HEADER = ["model", "parameters", "training FLOPs/token", "strategy", "measured bytes/param",
                     f"weak E (modelled), {projection.NS[0]} / {projection.NS[-1]} GPUs",
                     f"strong E (modelled), {projection.NS[0]} GPUs / largest N"]


def _projection_rows(summary) -> list[list[str]]:
    proj, rows = summary["projection"], []
    for model, m in proj["models"].items():
        per_token = m.get("flops_per_token")
        for name, p in m["strategies"].items():
            weak = [r["weak_efficiency"] for r in p["rows"]]
            strong = [(r["n"], r["strong_efficiency"]) for r in p["rows"] if r["strong_efficiency"] is not None]
            rows.append([
                model, _count(m["params"]), si(per_token, "FLOP") if per_token else "-", name,
                _bpp(proj, name), f"{efficiency(weak[0])} / {efficiency(weak[-1])}",
                f"{efficiency(strong[0][1])} / {efficiency(strong[-1][1])} (N = {strong[-1][0]})" if strong else "-",
            ])
    return rows


def _bpp(proj: dict, name: str) -> str:
    """A strategy's bytes per parameter in the projection table; hsdp's from the links model when not measured."""
    return f"{proj['bytes_per_param'][name]:.2f}" if name in proj["bytes_per_param"] else "links model"


LINKS_HEADER = ["model", "strategy", "N", "comm s/step", "compute s/step", "weak E (modelled, no overlap)",
                "weak E (modelled, full overlap)"]


def _links_rows(summary) -> list[list[str]]:
    """The links table (`projection._links`: the projection's own rows): hsdp (S = 8) against 1-D zero3 and ddp."""
    return [[r["model"], r["strategy"], str(r["n"]), f"{r['comm_s']:.3g}", f"{r['compute_s']:.3g}",
             efficiency(r["weak_efficiency"]), efficiency(r["overlapped_efficiency"])]
            for r in summary["projection"].get("links", {}).get("table", [])]


def _published_lines(summary) -> list[str]:
    """Each published scaling point beside the projection's throughput per GPU kept."""
    out = []
    for p in summary["projection"].get("links", {}).get("published", []):
        got = "; ".join(f"{s} {efficiency(v['weak_efficiency'])} (no overlap) to "
                        f"{efficiency(v['overlapped_efficiency'])} (full overlap)" for s, v in p["projected"].items())
        out.append(f"{p['what']}: {p['kept']:.0%} published ({p['source']}); projected {p['model']}, "
                   f"{p['from_n']} -> {p['to_n']} GPUs: {got}.")
    return out


def _projection_sources(summary) -> list[str]:
    proj = summary["projection"]
    return ([f"{name}: {m['source']}" for name, m in proj["models"].items()]
            + [f"Hardware: {proj['preset']['sources']}",
               f"FLOPs per sample of this run (XLA cost analysis): {summary['flops_per_sample']:.3g}.",
               f"Criterion: {proj['criterion']}.", plots.scaling_caption(proj)])


PRESET_UNITS = {"peak_flops": "FLOP/s", "nvlink_bytes_s": "B/s", "ib_bytes_s": "B/s", "memory_bytes": "B"}


def _preset_rows(summary) -> list[list[str]]:
    """The hardware preset, each number with its unit (989 TFLOP/s, not 989000000000000.0)."""
    preset = summary["projection"]["preset"]
    fmt = {"mfu": lambda v: f"{v:.0%} (assumed)", **{k: (lambda v, u=u: si(v, u)) for k, u in PRESET_UNITS.items()}}
    return [[k, fmt.get(k, str)(v)] for k, v in preset.items() if k != "sources"]


def _which(summary) -> dict:
    """summary.json's `recommendation` (`recommend.recommend`, derived from the measurements once: `write`)."""
    target = summary.get("target")  # compare --target: the target GPU's memory is the budget
    return summary.get("recommendation") or recommend.recommend(
        summary, budget=target["device_memory_bytes"] if target else None)


def _table_html(table_id: str, header: list[str], rows: list[list[str]]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td class='{'fail' if c == 'FAIL' else ''}'>{e(c)}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table id='{table_id}'><tr>{head}</tr>{body}</table>"


def _table_md(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def _notes(summary) -> list[str]:
    """NOTES (zero3's only with zero3), then the torch side's own notes (`torch_ref.analysis.accounting`), each once,
    in the order the strategies first give them."""
    names = {e["name"] for e in summary["strategies"]}
    torch_notes = dict.fromkeys(n for s in summary["strategies"] for n in s["frameworks"]["torch"].get("notes", []))
    sharded = registry.FULLY_SHARDED  # its notes only where it runs
    return [n for n in NOTES if sharded in names or not n.startswith(sharded)] + [f"torch: {n}" for n in torch_notes]


def html_page(summary, images: dict[str, bytes]) -> str:
    e = html.escape
    figs = "".join(f"<figure><img alt='{e(name)}' src='data:image/png;base64,{base64.b64encode(data).decode()}'>"
                   f"</figure>" for name, data in images.items())
    notes = "".join(f"<li>{e(n)}</li>" for n in _notes(summary))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{e(_title(summary))}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1150px; color: #222; }}
h1 {{ font-size: 22px; }} h2 {{ font-size: 17px; margin-top: 28px; }}
table {{ border-collapse: collapse; font-size: 13px; margin: 8px 0; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; }}
th {{ background: #f2f2f2; }} td.fail {{ color: #b00; font-weight: bold; }}
td.pick {{ font-weight: bold; white-space: nowrap; }} #recommendation ul {{ margin: 2px 0; padding-left: 18px; }}
figure {{ margin: 12px 0; }} img {{ max-width: 100%; border: 1px solid #eee; }}
.small {{ font-size: 12px; color: #555; }}
</style></head><body>
<h1>{e(_title(summary))}</h1>
<p class="small">{e(_config_line(summary))}
Parity tolerance: {summary["tolerance"]:g} ({e(summary["tolerance_why"])}).</p>
<h2>Which strategy</h2>
{recommend.as_html(_which(summary))}
<h2>Verdict</h2>
{_table_html("verdict", HEADER, _rows(summary))}{paths.html(summary, _table_html)}
<h2>Figures</h2>
{figs}
{target_rows.as_html(summary, _table_html)}<h2>Projection</h2>
{_table_html("projection", PROJECTION_HEADER, _projection_rows(summary))}
{_table_html("presets", ["preset", "value"], _preset_rows(summary))}
<ul class="small">{"".join(f"<li>{e(line)}</li>" for line in _projection_sources(summary))}</ul>
<h3>Links: NVLink inside a node, 8 NICs a node between nodes (hsdp at S = 8)</h3>
{_table_html("links", LINKS_HEADER, _links_rows(summary))}
<ul class="small">{"".join(f"<li>{e(line)}</li>" for line in _published_lines(summary) + [LINKS_NOTE])}</ul>
<h2>Notes</h2><ul>{notes}</ul>
<div id="status" hidden></div>
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
        "## Which strategy",
        "",
        *recommend.as_markdown(_which(summary)),
        "",
        "## Verdict",
        "",
        *_table_md(HEADER, _rows(summary)),
        *paths.markdown(summary, _table_md),
        "",
        "## Figures",
        "",
    ]
    lines += [f"![{name}]({name})" for name in image_files]
    lines += [*target_rows.markdown(summary, _table_md), "", "## Projection", "",
              *_table_md(PROJECTION_HEADER, _projection_rows(summary)), ""]
    lines += _table_md(["preset", "value"], _preset_rows(summary))
    lines += [""] + [f"- {line}" for line in _projection_sources(summary)]
    lines += ["", "### Links: NVLink inside a node, 8 NICs a node between nodes (hsdp at S = 8)", "",
              *_table_md(LINKS_HEADER, _links_rows(summary)), ""]
    lines += [f"- {line}" for line in _published_lines(summary) + [LINKS_NOTE]]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in _notes(summary)]
    return "\n".join(lines) + "\n"


def write(summary, out: str) -> dict:
    """The report's files in `out`, all or none (`atomic.staged`: a run stopped while writing leaves
    neither a partial report nor a folder it created)."""
    summary = {**summary, "recommendation": _which(summary)}  # one derivation for the page, the text and the JSON
    with atomic.staged(out) as stage:
        drawn = plots.draw_all(summary, stage)
        images = {os.path.basename(p): open(p, "rb").read() for p in drawn}
        with open(os.path.join(stage, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        with open(os.path.join(stage, "report.html"), "w") as f:
            f.write(html_page(summary, images))
        with open(os.path.join(stage, "report.md"), "w") as f:
            f.write(markdown(summary, list(images)))
    return {
        "html": os.path.join(out, "report.html"),
        "md": os.path.join(out, "report.md"),
        "json": os.path.join(out, "summary.json"),
        "images": [os.path.join(out, os.path.basename(p)) for p in drawn],
        "recommendation": summary["recommendation"],
    }
