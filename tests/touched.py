"""The quick tier touches every module (docs/TESTS.md): while `python -m pytest -m quick` runs (the whole tree,
no -k), every test process runs under cProfile; at the end the session fails, naming them, if a module of
jaxdp/ or torch_ref/ was left untouched. Touched: one of the module's functions ran (a call, not its import),
or, for a module with no function at all (an `__init__` that re-exports, a table, an entry point), its code
ran. Under pytest-xdist each worker writes what it saw to a folder the controller reads.

The processes the tests start (a CLI in a subprocess, spawned torch ranks) count too: the session puts
tests/touched_site/ on their PYTHONPATH, whose sitecustomize profiles them the same way and writes at exit
(a process killed by a signal writes nothing).
"""
from __future__ import annotations

import ast
import cProfile
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests import REPO

PACKAGES = ("jaxdp", "torch_ref")
BENCH = "tests/jaxdp/harness/bench/test_bench.py"  # `jaxdp bench --quick` in a fresh process: 90 s
# Modules only a timed or multi-process run reaches, which the quick tier leaves to the full suite: {module: the
# test file that exercises them}. The run's last line names them; tests/house/test_tests_tree.py checks the files.
FULL_SUITE_ONLY = {
    "jaxdp.harness.bench": BENCH, "jaxdp.harness.bench.goals": BENCH, "jaxdp.harness.bench.jit": BENCH,
    "jaxdp.harness.bench.markdown": BENCH, "jaxdp.harness.bench.measure": BENCH, "jaxdp.harness.bench.nan_check": BENCH,
    "jaxdp.harness.bench.reduction": "tests/jaxdp/harness/bench/test_bench_canonical.py",
    "jaxdp.core.run.timing": BENCH,  # timed runs: `jaxdp bench`, `jaxdp compare`
    "jaxdp.launch": "tests/jaxdp/test_multiprocess.py",  # `jaxdp train --processes 2`
}
OPTIONAL = {"tests.mutations.hf_honest": "transformers",  # touched where the extra is installed
            "tests.mutations.hf_models": "transformers",
            **{f"jaxdp.analysis.{m}": "jax_cuda12_plugin" for m in ("aot", "gpu_program", "target_memory")}}
FOLDER_ENV = "JAXDP_TESTS_TOUCHED_DIR"
_profile: cProfile.Profile | None = None


def enabled(config) -> bool:
    """Only the quick tier over the whole tree: `-m quick`, no -k, the configured testpaths."""
    return (config.getoption("markexpr") == "quick" and not config.getoption("keyword")
            and config.args_source == pytest.Config.ArgsSource.TESTPATHS)


def modules() -> dict[str, Path]:
    """{dotted name: file} of every module of the packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted(Path(REPO, package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path.resolve()
    return out


def has_functions(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) for node in ast.walk(tree))


def untouched(files: dict[str, Path], called: set[str], ran: set[str]) -> list[str]:
    """The modules none of whose functions was `called` (files whose functions ran), or, without functions,
    whose code never `ran` (files executed or imported)."""
    return [name for name, path in files.items()
            if str(path) not in (called if has_functions(path) else called | ran)]


def excused(name: str) -> bool:
    """A module the quick tier may leave untouched: FULL_SUITE_ONLY's, or OPTIONAL's without its extra."""
    if name in FULL_SUITE_ONLY:
        return True
    return name in OPTIONAL and importlib.util.find_spec(OPTIONAL[name]) is None


def seen(profile: cProfile.Profile) -> tuple[set[str], set[str]]:
    """(files one of whose functions ran, files whose code ran or which are imported) in this process."""
    profile.create_stats()
    called = {os.path.realpath(f) for f, _, name in profile.stats if name != "<module>"}
    ran = {os.path.realpath(f) for f, _, name in profile.stats if name == "<module>"}
    ran |= {os.path.realpath(m.__file__) for m in list(sys.modules.values()) if getattr(m, "__file__", None)}
    return called, ran


def pytest_configure(config):
    global _profile
    if not enabled(config):
        return
    if not hasattr(config, "workerinput") and FOLDER_ENV not in os.environ:  # the controller (or -n 0)
        os.environ[FOLDER_ENV] = tempfile.mkdtemp(prefix="jaxdp-touched-")  # the workers inherit it
        site = str(Path(REPO, "tests", "touched_site"))  # every process started from here profiles itself
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))
    if config.getoption("numprocesses", None) in (None, 0) or hasattr(config, "workerinput"):
        _profile = cProfile.Profile()
        _profile.enable()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if not enabled(session.config):
        return
    folder = Path(os.environ[FOLDER_ENV])
    if _profile is not None:
        _profile.disable()
        called, ran = seen(_profile)
        (folder / f"{os.getpid()}.called").write_text("\n".join(sorted(called)))
        (folder / f"{os.getpid()}.ran").write_text("\n".join(sorted(ran)))
    if hasattr(session.config, "workerinput"):
        return
    called = {line for f in folder.glob("*.called") for line in f.read_text().splitlines()}
    ran = {line for f in folder.glob("*.ran") for line in f.read_text().splitlines()}
    shutil.rmtree(folder, ignore_errors=True)
    files = modules()
    left = untouched(files, called, ran)
    failing = [name for name in left if not excused(name)]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if failing:
        reporter.write_line(f"quick tier: {len(failing)} module(s) untouched by the quick tests: {', '.join(failing)}",
                            red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    else:
        rest = f"; left to the full suite: {', '.join(left)}" if left else ""
        reporter.write_line(f"quick tier: {len(files) - len(left)} of the {len(files)} modules of "
                            f"{' and '.join(PACKAGES)} touched{rest}")
