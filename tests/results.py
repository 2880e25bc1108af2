"""The suite's figures for the docs (README.md, docs/TESTS.md), written by the run that measures them: with
`JAXDP_TEST_RESULTS=PATH` set (the README's test command's documented form, docs/TESTS.md), the session writes
PATH (docs/results/tests.json): `collection`, the tests the whole suite collects and each tier's size, counted
from the collection before `-m`, `-k` or `--deselect` take any, and `run`, how many passed, failed, were skipped
and the run's wall seconds. `--collect-only` rewrites the collection and keeps the file's run. Only a run over
the whole suite (no paths given) writes. `python3 .ci/docs.py --write` renders the file into the pages.

Without the variable, a run over the whole suite compares its collection with the repository's
docs/results/tests.json and says in one line when the file is out of date, and how to write it again.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time

import pytest
from _pytest.config import Config

from tests import REPO, quick

ENV = "JAXDP_TEST_RESULTS"
SIDE = "JAXDP_TEST_COLLECTION"  # where the collecting process (an xdist worker, or pytest itself) leaves its tiers
RESULTS = "docs/results/tests.json"
COUNTED = ("passed", "failed", "skipped", "xfailed", "xpassed", "error")
_started: list[float] = []


def _path(config: Config) -> str | None:
    path = os.environ.get(ENV)
    return os.path.join(REPO, path) if path and not os.path.isabs(path) else path


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def tiers(items) -> dict:
    """{tier: its size} over `items`, the whole collection: every test, the quick tier (tests/quick.py's table or
    a `quick` marker), the slow ones."""
    quick_ = [i for i in items if quick.chosen(i.nodeid, i.name, getattr(i, "originalname", i.name))
              or i.get_closest_marker("quick")]
    return {"all": len(items), "quick": len(quick_), "slow": sum(1 for i in items if i.get_closest_marker("slow"))}


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the workers, started later, inherit the variable
        path = _path(config)
        if path:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        side = path + ".collection" if path else os.path.join(tempfile.mkdtemp(prefix="jaxdp-tiers-"), "tiers.json")
        os.environ[SIDE] = side


def pytest_sessionstart(session):
    _started.append(time.time())


@pytest.hookimpl(tryfirst=True)  # before -m, -k and --deselect take their tests
def pytest_collection_modifyitems(config, items):
    if os.environ.get(SIDE):  # the controller under xdist does not collect: its workers (each the same) write it
        with open(os.environ[SIDE], "w") as f:
            json.dump(tiers(items), f)


def _run(session) -> dict:
    stats = session.config.pluginmanager.get_plugin("terminalreporter").stats
    counts = {k: len([r for r in stats.get(k, []) if getattr(r, "when", "call") in ("call", "setup")])
              for k in COUNTED}
    return {**counts, "seconds": round(time.time() - _started[0]), "commit": _commit()}


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    path, side = _path(config), os.environ.get(SIDE, "")
    if hasattr(config, "workerinput"):
        return
    collected = json.load(open(side)) if os.path.exists(side) else None
    if os.path.exists(side):
        os.remove(side)
    if not path and side:
        os.rmdir(os.path.dirname(side))  # this session's own folder
    if config.args_source != Config.ArgsSource.TESTPATHS or collected is None:
        return  # a part of the suite: its figures are not the suite's
    if not path:
        _say_if_stale(config, collected)
        return
    old = json.load(open(path)) if os.path.exists(path) else {}
    out = {"collection": {"tests": collected, "commit": _commit()}, "run": old.get("run")}
    if not config.option.collectonly:
        out["run"] = {**_run(session), "exit": int(exitstatus)}
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


def _say_if_stale(config, collected: dict) -> None:
    """One line when the repository's results file holds another collection than this run's."""
    file = config.rootpath / RESULTS
    recorded = json.loads(file.read_text()).get("collection", {}).get("tests") if file.exists() else None
    if recorded is not None and recorded != collected:
        config.pluginmanager.get_plugin("terminalreporter").write_line(
            f"{RESULTS} records the collection {recorded}, this suite collects {collected}: "
            f"{ENV}={RESULTS} python3 -m pytest --collect-only -q, then python3 .ci/docs.py --write")
