"""The honest matrix's results file (docs/results/honest.json, written by `python -m tests.mutations.honest
--results FILE`) rendered as markdown, and that rendering kept in docs/PARITY.md between the markers

    <!-- honest:begin --> ... <!-- honest:end -->

    python -m tests.mutations.honest_render [--results FILE] [--doc FILE] [--check]

`render(results) -> str` is the plain function (results: the file's JSON); `--check` exits 1 when the doc's
block differs from the rendering (tests/mutations/test_honest_render.py does the same).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

RESULTS, DOC = "docs/results/honest.json", "docs/PARITY.md"
BEGIN, END = "<!-- honest:begin -->", "<!-- honest:end -->"
DTYPES = ("float64", "float32", "bfloat16")


def summarise(comparisons: list[dict], measures: list[str]) -> dict:
    """The summary of judged comparisons ({case, ok, ratios, failures} each): the counts, per measure the
    worst ratio and its case, and per dtype (the case's third word) the counts and each measure's worst."""
    def worst(rows):
        out = {}
        for m in measures:
            have = [r for r in rows if m in r["ratios"]]
            if have:
                top = max(have, key=lambda r: r["ratios"][m])
                out[m] = {"ratio": top["ratios"][m], "case": top["case"]}
        return out

    by_dtype = {}
    for dtype in DTYPES:
        rows = [r for r in comparisons if f" {dtype} " in f" {r['case']} "]
        by_dtype[dtype] = {"comparisons": len(rows), "passed": sum(r["ok"] for r in rows),
                           "worst": {m: w["ratio"] for m, w in worst(rows).items()}}
    return {"comparisons": len(comparisons), "passed": sum(r["ok"] for r in comparisons), "worst": worst(comparisons),
            "by_dtype": by_dtype}


def render(results: dict) -> str:
    """The markdown block of a results file: the command, the counts, per measure the worst honest ratio
    (measure / bound) and its case, per dtype the counts and worst ratios, and every failure."""
    s = results["summary"]
    fails = [r for r in results["comparisons"] if not r["ok"]]
    lines = [f"`{results['command']}` ({results['wall_s'] / 60:.1f} min on {results['machine']}; "
             f"transformers' float32 sites {'promoted to float64' if results['promote'] else 'as built'}):",
             "", f"**{s['comparisons']} comparisons, {s['passed']} pass, {len(fails)} fail** "
             f"({', '.join(f'{k} {v}' for k, v in results['sets'].items())}; "
             f"transformers families: {', '.join(results['families'])}).", "",
             "| measure | worst honest ratio (measure / bound) | case |", "|---|---|---|"]
    lines += [f"| {m} | {w['ratio']:.3g} | {w['case']} |" for m, w in s["worst"].items()]
    lines += ["", "| dtype | comparisons | pass | worst ratio per measure |", "|---|---|---|---|"]
    lines += [f"| {d} | {v['comparisons']} | {v['passed']} | "
              f"{', '.join(f'{m} {r:.3g}' for m, r in v['worst'].items())} |" for d, v in s["by_dtype"].items()]
    if fails:
        lines += ["", "Failures:", ""] + [f"- {r['case']}: {'; '.join(r['failures'])}" for r in fails]
    return "\n".join(lines)


def block(doc: str) -> str | None:
    """The text between the markers of `doc` (without them, stripped), None when a marker is missing."""
    if BEGIN not in doc or END not in doc:
        return None
    return doc.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def replaced(doc: str, text: str) -> str:
    """`doc` with the text between its markers replaced by `text`."""
    head, rest = doc.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{text}\n{END}{rest.split(END, 1)[1]}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutations.honest_render",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default=RESULTS, help=f"the results file (default {RESULTS})")
    parser.add_argument("--doc", default=DOC, help=f"the doc holding the markers (default {DOC})")
    parser.add_argument("--check", action="store_true", help="exit 1 when the doc's block is not the rendering")
    args = parser.parse_args(argv)
    from jaxdp.core.files import atomic

    try:
        results = json.loads(pathlib.Path(args.results).read_text())
        doc = pathlib.Path(args.doc).read_text()
    except (OSError, ValueError) as e:
        print(f"--results {args.results} / --doc {args.doc}: {e}; pass readable files", file=sys.stderr)
        return 2
    if block(doc) is None:
        print(f"--doc {args.doc}: no {BEGIN} ... {END} markers; add them where the block goes", file=sys.stderr)
        return 2
    text = render(results)
    if args.check:
        return 0 if block(doc) == text else 1
    atomic.write_text(args.doc, replaced(doc, text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
