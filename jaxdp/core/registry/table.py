"""The registry's rows as the docs' tables: `render()` gives the markdown of both tables, and
`python -m jaxdp.core.registry.table [--write] [PAGE]` prints it or writes it into PAGE (docs/REGISTRY.md)
between its markers; tests/jaxdp/core/registry/test_registry.py fails when the page and the rows differ."""
from __future__ import annotations

import sys
from pathlib import Path

from . import models, strategies

BEGIN, END = "<!-- registry:begin (python -m jaxdp.core.registry.table --write) -->", "<!-- registry:end -->"
PAGE = Path(__file__).resolve().parents[3] / "docs" / "REGISTRY.md"
PARTS = ("params", "grads", "opt state")


def _code(path: str) -> str:
    return f"`{path}`" if path else ""


def _options(e: strategies.Entry) -> str:
    if e.jax_options == e.torch_options:
        return ", ".join(e.jax_options)
    jax, torch = ", ".join(e.jax_options) or "none", ", ".join(e.torch_options) or "none"
    return f"jax: {jax}; torch: {torch}" if e.torch else jax


def strategy_rows() -> list[str]:
    head = ["| strategy | what it is | jaxdp | torch_ref | shards | options | oracle |", "|---" * 7 + "|"]
    rows = []
    for e in strategies.ENTRIES:
        torch = _code(e.torch) or (f"runs `{e.twin}` ({e.twin_tool})" if e.twin else "")
        shards = ", ".join(p for p, s in zip(PARTS, e.shards, strict=True) if s) or "nothing (a full copy)"
        rows.append(f"| `{e.name}` | {e.summary} | {_code(e.jax)} | {torch} | {shards} | {_options(e)} | "
                    f"`{e.oracle}` |")
    return head + rows


def model_rows() -> list[str]:
    head = ["| model | what it is | jaxdp | torch_ref | data | its own flags | parameters |", "|---" * 7 + "|"]
    return head + [f"| `{e.name}` | {e.summary} | {_code(e.jax)} | {_code(e.torch)} | {', '.join(e.data)} | "
                   f"{', '.join('--' + f.replace('_', '-') for f in e.flags)} | {_code(e.parameters)} |"
                   for e in models.ENTRIES]


def render() -> str:
    """The block between the page's markers: both tables."""
    return "\n".join([BEGIN, "", *strategy_rows(), "", *model_rows(), "", END])


def written(page: str) -> str:
    """`page` with its block replaced by `render()` (the markers must be there)."""
    start, stop = page.index(BEGIN), page.index(END) + len(END)
    return page[:start] + render() + page[stop:]


def main(argv: list[str]) -> int:
    if "--write" not in argv:
        print(render())
        return 0
    page = Path(next((a for a in argv if a != "--write"), PAGE))
    page.write_text(written(page.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
