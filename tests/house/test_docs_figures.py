"""The docs' moving figures are their results files' (`.ci/docs.py`), and the pages hold together: every
relative link resolves, nothing links into docs/history/, each page is under 600 lines with no dated or
issue-numbered heading. And the suite's own figures are written by the run that measures them
(tests/results.py), from a run over a whole (here: a small) suite under pytest-xdist."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import REPO

spec = importlib.util.spec_from_file_location("ci_docs", Path(REPO, ".ci", "docs.py"))
docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(docs)

PAGES = sorted(Path(REPO, "docs").glob("*.md")) + [Path(REPO, "README.md")]
HISTORY = sorted(Path(REPO, "docs", "history").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")
DATED = re.compile(r"^#+ .*(\b20\d\d-\d\d-\d\d\b|\bissues? \d+)", re.I | re.M)


def test_every_figure_and_block_is_what_its_results_file_renders():
    assert not docs.stale(), "stale: python3 .ci/docs.py --write"


def test_a_figure_that_differs_from_its_results_file_is_stale(monkeypatch):
    results = {"collection": {"tests": {"all": 7, "quick": 3, "slow": 1}}, "run": None}
    monkeypatch.setattr(docs, "load", lambda path: results if path == docs.TESTS else None)
    page = "the suite: <!-- fig:tests.all -->2592<!-- /fig --> tests, <!-- fig:tests.quick -->3<!-- /fig --> quick"
    new, names = docs.rendered("docs/TESTS.md", page)
    assert new == "the suite: <!-- fig:tests.all -->7<!-- /fig --> tests, <!-- fig:tests.quick -->3<!-- /fig --> quick"
    assert names == ["tests.all", "tests.quick"]
    block = "<!-- gen:gpu-target -->\nan old table\n<!-- /gen:gpu-target -->"
    assert "not measured in this checkout" in docs.rendered("docs/BENCHMARKS.md", block)[0]
    with pytest.raises(SystemExit, match="unknown figure"):
        docs.rendered("README.md", "<!-- fig:tests.none -->1<!-- /fig -->")


def _anchors(page: Path) -> set[str]:
    heads = re.findall(r"^#+ (.*)$", page.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def broken(pages: list[Path], root: str = REPO) -> list[str]:
    """'page: link' for every relative link whose file (or heading) is not there."""
    out = []
    for page in pages:
        for link in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", link):
                continue  # http:, https:, mailto:
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            if not target.exists() or (anchor and target.suffix == ".md" and anchor not in _anchors(target)):
                out.append(f"{page.relative_to(root)}: {link}")
    return out


def test_every_relative_link_resolves():
    assert not broken(PAGES + HISTORY)


def test_the_link_check_sees_a_missing_page_and_heading(tmp_path):
    (tmp_path / "A.md").write_text("# Top\n[b](B.md) [top](#top) [gone](#gone) [web](https://x.org/y)\n")
    (tmp_path / "B.md").write_text("# B\n[a](A.md#top) [c](C.md)\n")
    assert broken([tmp_path / "A.md", tmp_path / "B.md"], str(tmp_path)) == ["A.md: #gone", "B.md: C.md"]


def test_nothing_links_into_the_history():
    assert not [f"{p.name}: {link}" for p in PAGES for link in LINK.findall(p.read_text()) if "history/" in link]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_page_says_how_things_are_now(page):
    text = page.read_text()
    assert len(text.splitlines()) < 600, f"{page.name}: {len(text.splitlines())} lines; move history to docs/history/"
    assert not DATED.findall(text), f"{page.name}: dated or issue-numbered headings"


def test_the_heading_check_sees_a_date_and_an_issue():
    assert len(DATED.findall("# Runs of 2026-12-06\n## What issue 35 asked\n## Issues\n")) == 2


SUITE = """
    import pytest
    def test_a(): pass
    def test_b(): pass
    @pytest.mark.skip(reason="a skipped test, which the results file must count as skipped")
    def test_c(): pass
    @pytest.mark.quick
    def test_d(): pass
"""


@pytest.mark.parametrize("workers", ["2"])  # under xdist, as the suite runs (-n 0 writes through the same hook)
def test_the_suites_figures_are_written_by_its_run(tmp_path, workers):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(textwrap.dedent(SUITE))
    (tmp_path / "conftest.py").write_text("from tests import results\n\n\ndef pytest_configure(config):\n"
                                          "    config.pluginmanager.register(results)\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\ntestpaths = tests\nmarkers = quick\n    slow\n")
    out = tmp_path / "tests.json"
    env = {**os.environ, "JAXDP_TEST_RESULTS": str(out), "PYTHONPATH": REPO}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", workers,
                          "--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    got = json.loads(out.read_text())
    assert got["collection"]["tests"] == {"all": 4, "quick": 1, "slow": 0}
    assert {k: got["run"][k] for k in ("passed", "skipped", "failed", "exit")} == {
        "passed": 3, "skipped": 1, "failed": 0, "exit": 0}
    assert not (tmp_path / "tests.json.collection").exists()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
                    "-c", str(tmp_path / "pytest.ini"), "tests/test_x.py::test_a"],
                   cwd=tmp_path, env=env, capture_output=True, timeout=120)
    assert json.loads(out.read_text()) == got, "a part of the suite wrote the suite's figures"
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "tests.json").write_text(out.read_text())
    (tmp_path / "tests" / "test_y.py").write_text("def test_e(): pass\n")
    del env["JAXDP_TEST_RESULTS"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", workers,
                          "--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "docs/results/tests.json records the collection" in run.stdout and "'all': 5" in run.stdout, run.stdout


def test_ci_run_refuses_an_unknown_argument_before_any_work():
    run = subprocess.run(["bash", str(Path(REPO, ".ci", "run")), "--recrod"], capture_output=True, text=True,
                         timeout=30)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "--record" in run.stderr, run.stderr
