"""docs/KERNELS.md's measured matrix, rendered from `jaxdp.harness.fused_matrix`'s results file
(`python -m jaxdp.harness.fused_matrix --render docs/KERNELS.md`): between the page's two markers, one row per
(pair kind, dtype, model) with its pairs, failures and worst measures, the bound of each, and the worst tensor
of the gradient. tests/jaxdp/harness/test_fused_matrix.py checks that the page holds what the file renders."""
from __future__ import annotations

from ..core.files import atomic

START, END = "<!-- fused matrix: start -->", "<!-- fused matrix: end -->"
FIELDS = ("loss", "grad", "param", "update", "step update")


def _num(v) -> str:
    return "-" if v is None else f"{v:.1e}"


def _cells(rows: list[dict]) -> dict:
    """{(kind, dtype, model): [rows]} in the matrix's order."""
    out: dict = {}
    for r in rows:
        out.setdefault((r["kind"], r["dtype"], r["model"]), []).append(r)
    return out


def _worst(rows: list[dict], f: str) -> tuple[float | None, dict | None]:
    found = [(r["worst"][f], r) for r in rows if r["worst"][f] is not None]
    return max(found, key=lambda x: x[0], default=(None, None))


def render(results: dict) -> str:
    """The section's markdown (without the markers)."""
    rows = results["rows"]
    failed = [r for r in rows if not r["ok"]]
    slices = results.get("slices", [])
    ran = (f"run as {len(slices)} slices side by side ({'; '.join(f'`{c}`' for c in slices)}, then `--merge`), "
           f"{results['seconds']} s summed over the slices" if slices else f"{results['seconds']} s")
    lines = [f"`{results['command']}`: {len(rows)} pairs, {len(failed)} failed; {ran} on a shared 2-core machine "
             f"(the results file: `docs/fused_matrix.json`). Each cell: the worst over every pair, step and tensor "
             f"/ the judge's bound (`-`: not judged per tensor, docs/PARITY.md).", "",
             "| pair | dtype | model | pairs | failed | " + " | ".join(FIELDS) + " | worst gradient at |",
             "|---|---|---|---|---|" + "---|" * len(FIELDS) + "---|"]
    for (kind, dtype, model), cell in _cells(rows).items():
        bounds = cell[0]["bounds"]
        worst = {f: _worst(cell, f)[0] for f in FIELDS}
        _, at = _worst(cell, "grad")
        where = f"{at['strategy']} N={at['devices']}, {at['worst_key']['grad']}" if at else "-"
        lines.append(f"| {kind} | {dtype} | {model} | {len(cell)} | {sum(not r['ok'] for r in cell)} | "
                     + " | ".join(f"{_num(worst[f])} / {_num(bounds[f])}" for f in FIELDS) + f" | {where} |")
    derived = [(r["derived"].get("resolved update"), r) for r in rows if r.get("derived")]
    if derived:
        ratio, r = max(derived, key=lambda x: x[0] or 0.0)
        lines += ["", f"The bounds derived from the traces (float32, docs/PARITY.md): the worst update reached "
                      f"{ratio:.2f} of its derived bound ({r['kind']}, {r['model']} {r['strategy']} N={r['devices']})."]
    if failed:
        lines += ["", "Failed pairs:", ""] + [f"- {r['kind']} {r['model']} {r['dtype']} {r['strategy']} "
                                              f"N={r['devices']}: {'; '.join(r['failures'])}" for r in failed]
    return "\n".join(lines)


def section(page: str, results: dict) -> str:
    """`page` with its section between the markers replaced by `render(results)`."""
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{render(results)}\n{END}{tail}"


def write(path: str, results: dict) -> None:
    with open(path) as f:
        page = f.read()
    atomic.write_text(path, section(page, results))
