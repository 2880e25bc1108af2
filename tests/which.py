"""A module's tests, from its path: `python -m tests.which jaxdp/strategies/zero/zero2.py` prints the test files
in the module's folder of tests (tests/<its package>/, and tests/<package>/<module>/ where one exists), for a
torch_ref module also its JAX twin's folder (where the cross-framework tests live), and then every other test
file that imports the module. The tree's rule (tests/house/test_tests_tree.py): every test file sits under
tests/<a source package or module>/ or one of CROSS_CUTTING's folders.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

from tests import REPO

TESTS = Path(REPO, "tests")
PARITY = Path(REPO, "parity_tests")  # the cross-framework parity suite, at the top level (README)
PACKAGES = ("jaxdp", "torch_ref")
CROSS_CUTTING = {  # folders of tests whose subject is no one module
    "cli": "both command lines as a user meets them: every flag's bad input, exit statuses, processes",
    "examples": "examples/, smoke-tested",
    "house": "the house's rules: imports, layout, the tests' own tree",
    "mutations": "the judge's own proof as tools: the bug catalogue, the honest matrix, the detection limits",
}
# Folders of tests for source paths another worktree of issue 37 creates (allowed until the source exists).
def test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py"))


def folder_subject(folder: Path) -> str | None:
    """The source path a folder of tests mirrors ('jaxdp/strategies/zero'), its cross-cutting name, or None."""
    rel = folder.relative_to(TESTS).as_posix()
    top = rel.split("/")[0]
    if top in CROSS_CUTTING:
        return top
    if top in PACKAGES and (Path(REPO, rel).is_dir() or Path(REPO, rel + ".py").is_file()):
        return rel
    return None


def mirror_folders(source: str) -> list[Path]:
    """The folders of tests a source file's tests sit in."""
    path = Path(source).with_suffix("")
    parts = path.parts if path.name != "__init__" else path.parts[:-1]
    names = ["/".join(parts[:-1]), "/".join(parts)] if path.name != "__init__" else ["/".join(parts)]
    if parts[0] == "torch_ref":  # the cross-framework tests sit at the JAX twin's path
        names += ["jaxdp/" + n.split("/", 1)[1] for n in names if "/" in n]
    return [TESTS / n for n in dict.fromkeys(names) if n and (TESTS / n).is_dir()]


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports (at any depth, `from a import b` counted as a and a.b)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return out


def tests_of(source: str) -> tuple[list[Path], list[Path]]:
    """(the test files in the source's folders of tests, the other test files importing it)."""
    folders = mirror_folders(source)
    own = [p for p in test_files() if p.parent in folders]
    module = ".".join(Path(source).with_suffix("").parts).removesuffix(".__init__")
    others = test_files() + sorted(PARITY.glob("test_*.py"))
    importing = [p for p in others if p not in own and module in imported_modules(p)]
    return own, importing


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip())
        return 2
    for source in argv:
        rel = Path(source).resolve().relative_to(Path(REPO).resolve()).as_posix() if Path(source).exists() else source
        own, importing = tests_of(rel)
        print(f"{rel}:")
        print("\n".join(f"  {p.relative_to(REPO)}" for p in own) or "  (no folder of tests)")
        if importing:
            print("  importing it:\n" + "\n".join(f"    {p.relative_to(REPO)}" for p in importing))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
