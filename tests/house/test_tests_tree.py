"""The tests' own house rules (docs/TESTS.md): tests follow the tree (every test file sits under a folder that
mirrors a source package or module, or a listed cross-cutting folder), `python -m tests.which` finds a module's
tests from its path, and the quick tier's check that every module was touched fails when one was not."""
from __future__ import annotations

import ast
import os
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
    own, importing = which.tests_of("jaxdp/judge/parity.py")
    assert Path(REPO, "parity_tests/test_parity.py") in importing  # the parity suite, at the top level
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


EXTRAS = ("transformers",)  # the optional extras a test may use (`hf`): absent from a `.[dev]` install


def unguarded_extra_imports(source: str) -> list[int]:
    """Lines of `import transformers` (or from it) that no `pytest.importorskip("transformers...")` before it,
    in its function or at module level, and no `try: ... except ImportError` around it, guards."""
    tree, bad = ast.parse(source), []

    def skips(node) -> bool:
        return (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip" and node.args
                and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).split(".")[0] in EXTRAS)

    def calls(node):  # the node's calls, not those in the functions or classes it defines
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        yield node
        for child in ast.iter_child_nodes(node):
            yield from calls(child)

    def visit(body, guarded: bool) -> None:
        for node in body:
            if any(skips(n) for n in calls(node)):
                guarded = True  # from here on in this scope
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] in EXTRAS for n in names) and not guarded:
                bad.append(node.lineno)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(node.body, guarded)
            elif isinstance(node, ast.Try):
                caught = any(isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                             for h in node.handlers)
                visit(node.body, guarded or caught)
            elif isinstance(node, (ast.If, ast.With, ast.For)):
                visit(node.body, guarded)

    visit(tree.body, False)
    return bad


def test_every_test_file_imports_the_hf_extra_guarded():
    """The quick tier runs in an install without the `hf` extra (`pip install -e ".[dev]"`): a test file
    imports transformers only after `pytest.importorskip` (or under `except ImportError`). The run that
    shows it: `PYTHONPATH=tests/without_hf:. python -m pytest -m quick` (docs/TESTS.md)."""
    bad = {str(p.relative_to(REPO)): lines for p in which.test_files()
           if (lines := unguarded_extra_imports(p.read_text()))}
    assert not bad, f"transformers imported without pytest.importorskip('transformers') before it: {bad}"


def test_the_extra_check_sees_an_unguarded_import():
    unguarded = "def test_x():\n    import transformers\n"
    assert unguarded_extra_imports(unguarded) == [2]
    assert unguarded_extra_imports("from transformers.models import gpt2\n") == [1]
    assert not unguarded_extra_imports("import pytest\n\ndef test_x():\n    pytest.importorskip('transformers')\n"
                                       "    import transformers\n")
    assert not unguarded_extra_imports("pytest.importorskip('transformers')\nimport transformers\n")
    assert not unguarded_extra_imports("try:\n    import transformers\nexcept ImportError:\n    pass\n")
    assert unguarded_extra_imports("def f():\n    pytest.importorskip('transformers')\n\n"
                                   "def test_x():\n    import transformers\n") == [5]  # another function's guard


def test_without_hf_hides_transformers_under_the_quick_tiers_own_sitecustomize():
    """tests/without_hf stacks with tests/touched_site (which the quick tier puts first on its processes' path):
    in both orders no process finds transformers, as in an install without the `hf` extra."""
    code = ("import importlib.util, sys\ntry:\n    import transformers\nexcept ModuleNotFoundError:\n"
            "    print(importlib.util.find_spec('transformers'))")
    for first, second in (("touched_site", "without_hf"), ("without_hf", "touched_site")):
        path = os.pathsep.join([f"{REPO}/tests/{first}", f"{REPO}/tests/{second}", REPO])
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": path}, check=True).stdout
        assert out == "None\n", (first, out)
