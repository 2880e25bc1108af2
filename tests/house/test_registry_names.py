"""One registry (jaxdp/core/registry/): the literal name of a strategy ("zero2" in quotes) appears in at most
LIMIT package files under jaxdp/ and torch_ref/, the registry's row among them; every other list reads the row
(its fields, or the names `registry.ONE_DEVICE`, `REPLICATED`, `FULLY_SHARDED`, `DEFAULT` and `tagged(...)` read
from them). No name stands above the limit."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from jaxdp.core.registry import strategies
from tests import REPO

pytestmark = pytest.mark.quick
LIMIT = 6
PACKAGES = ("jaxdp", "torch_ref")


def files_naming(name: str, root: Path = Path(REPO), packages=PACKAGES) -> list[str]:
    """The package .py files that hold `name` as a string literal ("name" or 'name')."""
    pattern = re.compile(f"\"{re.escape(name)}\"|'{re.escape(name)}'")
    return sorted(str(p.relative_to(root)) for package in packages for p in (root / package).rglob("*.py")
                  if pattern.search(p.read_text(encoding="utf-8")))


@pytest.mark.parametrize("name", [e.name for e in strategies.ENTRIES] + list(strategies.ALIASES))
def test_a_strategys_name_is_written_in_few_package_files(name):
    files = files_naming(name)
    assert "jaxdp/core/registry/strategies.py" in files or name in strategies.ALIASES
    assert len(files) <= LIMIT, (f"{name!r} is written in {len(files)} package files (at most {LIMIT}): read "
                                 f"its row in jaxdp/core/registry/strategies.py instead: {files}")


def test_the_count_sees_both_quotes_and_no_longer_name(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text('X = "zero2"\n')
    (tmp_path / "pkg" / "b.py").write_text("Y = {'zero2': 1}\n")
    (tmp_path / "pkg" / "c.py").write_text('"""zero2\'s layout"""\nZ = "zero2-jit", "make_zero2"\n')  # not the name
    assert files_naming("zero2", tmp_path, ("pkg",)) == ["pkg/a.py", "pkg/b.py"]
