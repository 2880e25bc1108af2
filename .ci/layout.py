"""The layout map (docs/LAYOUT.md), generated: every module and package of jaxdp/ and torch_ref/ with the first
sentence of its docstring. `python3 .ci/layout.py` prints it; `--write` puts it into docs/LAYOUT.md between
the layout markers; `--check` exits 1 when docs/LAYOUT.md's map differs (tests/house/test_house.py runs it)."""
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- layout: start -->", "<!-- layout: end -->"
WIDTH = 32  # the path column
MAP = ROOT / "docs" / "LAYOUT.md"  # where the map lives (the README links to it)


def summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    sentence = re.split(r"(?<=[.;])\s", text)[0].rstrip(".;")
    return sentence if len(sentence) <= 86 else sentence[:85].rsplit(" ", 1)[0] + " …"


def lines(folder: Path, depth: int = 0) -> list[str]:
    out = []
    init = folder / "__init__.py"
    name = folder.name + "/"
    out.append(f"{'  ' * depth}{name:<{WIDTH - 2 * depth}}{summary(init)}")
    for path in sorted(folder.iterdir()):
        if path.is_dir() and (path / "__init__.py").exists():
            out += lines(path, depth + 1)
        elif path.suffix == ".py" and path.name != "__init__.py":
            pad = WIDTH - 2 * (depth + 1)
            out.append(f"{'  ' * (depth + 1)}{path.name:<{pad}}{summary(path)}")
    return out


def layout() -> str:
    body = "\n".join(line.rstrip() for pkg in ("jaxdp", "torch_ref") for line in lines(ROOT / pkg))
    return f"{START}\n```\n{body}\n```\n{END}"


def main(argv: list[str]) -> int:
    readme = MAP.read_text()
    found = re.search(re.escape(START) + ".*?" + re.escape(END), readme, flags=re.S)
    if "--write" in argv:
        if not found:
            sys.exit(f"{MAP.relative_to(ROOT)} has no {START} ... {END} section to write into")
        MAP.write_text(readme[:found.start()] + layout() + readme[found.end():])
        return 0
    if "--check" in argv:
        if not found or found.group(0) != layout():
            print(f"{MAP.relative_to(ROOT)}'s layout map is out of date: run python3 .ci/layout.py --write",
                  file=sys.stderr)
            return 1
        return 0
    print(layout())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
