"""The tests' own house rules (docs/TESTS.md): tests follow the tree (every test file sits under a folder that
mirrors a source package or module, or a listed cross-cutting folder), `python -m tests.which` finds a module's
tests from its path, and the quick tier's check that every module was touched fails when one was not."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO, quick, touched, which

pytestmark = pytest.mark.quick


def test_every_test_file_sits_under_a_folder_mirroring_the_source():
    misplaced = [str(p.relative_to(REPO)) for p in which.test_files() if which.folder_subject(p.parent) is None]
    assert not misplaced, f"test files outside tests/<package>/ and {sorted(which.CROSS_CUTTING)}: {misplaced}"


def test_every_folder_of_tests_is_a_package():
    """tests/jaxdp/ must not shadow the jaxdp package: each folder is imported as tests.<path>."""
    folders = {p.parent for p in which.test_files()}
    assert not [str(f) for f in folders if not (f / "__init__.py").is_file()]


def test_which_lists_a_modules_tests_from_its_path():
    own, _ = which.tests_of("jaxdp/strategies/zero/zero2.py")
    assert Path(REPO, "tests/jaxdp/strategies/zero/test_zero.py") in own
    own, importing = which.tests_of("jaxdp/harness/parity.py")
    assert Path(REPO, "tests/jaxdp/harness/parity/test_parity.py") in own  # the module's own folder
    assert Path(REPO, "tests/jaxdp/strategies/test_strategies.py") in importing
    out = subprocess.run([sys.executable, "-m", "tests.which", "jaxdp/strategies/zero/zero2.py"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    assert "tests/jaxdp/strategies/zero/test_zero.py" in out


def test_a_module_left_untouched_is_named(tmp_path):
    """The quick tier's check: a module whose functions never ran is named; one without functions counts
    as touched once its code ran."""
    lib, table = tmp_path / "lib.py", tmp_path / "table.py"
    lib.write_text("def f():\n    return 1\n")
    table.write_text("ROWS = (1, 2)\n")
    files = {"pkg.lib": lib, "pkg.table": table}
    assert touched.untouched(files, called=set(), ran={str(lib), str(table)}) == ["pkg.lib"]  # imported only
    assert touched.untouched(files, called={str(lib)}, ran=set()) == ["pkg.table"]
    assert touched.untouched(files, called={str(lib)}, ran={str(table)}) == []
    assert set(touched.modules()) >= {"jaxdp", "jaxdp.strategies.zero.zero2", "torch_ref"}


def test_the_quick_tiers_table_names_tests_that_exist():
    """tests/quick.py's table: every file exists and every name is a test function of it."""
    for path, names in quick.QUICK.items():
        tree = ast.parse(Path(REPO, path).read_text())
        defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        missing = [] if names == quick.ALL else [n for n in names if n.split("[")[0] not in defined]
        assert not missing, f"{path}: {missing}"


def test_what_the_quick_tier_leaves_to_the_full_suite_has_a_test_file_there():
    for module, path in touched.FULL_SUITE_ONLY.items():
        assert module in touched.modules() and Path(REPO, path).is_file(), (module, path)
