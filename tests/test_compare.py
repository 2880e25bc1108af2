"""`jaxdp compare`: the report's files and figures, accounting against theory, the page in a real
headless browser (Chromium), the examples, and the refusals."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from jaxdp import cli
from jaxdp.report import render, runner

from .conftest import BASE

CFG = BASE.replace(devices=2, steps=5, batch_size=16, dtype="float32", optimizer="adam", lr=1e-3, weight_decay=0.0)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def report(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("report"))
    summary = runner.compare(CFG, ["ddp", "zero3"])
    return summary, render.write(summary, out), out


def test_report_files_and_summary(report):
    summary, paths, out = report
    assert sorted(os.listdir(out)) == sorted(["report.html", "report.md", "summary.json", "loss.png", "parity.png",
                                              "step_time.png", "memory.png", "communication.png", "scaling.png"])
    assert json.load(open(paths["json"]))["devices"] == 2
    for entry in summary["strategies"]:
        assert entry["parity"]["pass"], entry["parity"]
        jax_side = entry["frameworks"]["jax"]
        assert len(jax_side["losses"]) == 5 and jax_side["timed_steps"] == 3  # compile + 1 warm-up excluded
        assert jax_side["memory"] == entry["theory"]["memory"]               # measured == ZeRO formula
    ddp = summary["strategies"][0]
    assert ddp["frameworks"]["jax"]["comm"]["total"] == pytest.approx(ddp["theory"]["comm"]["total"], rel=1e-12)
    rows = summary["projection"]["ddp"]["rows"]
    assert [r["n"] for r in rows] == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert all(0 < r["weak_efficiency"] <= 1 and 0 < r["strong_efficiency"] <= 1 for r in rows)


def test_html_is_self_contained_and_markdown_has_the_same_table(report):
    _, paths, _ = report
    page = open(paths["html"]).read()
    assert len(re.findall(r"<img [^>]*src='data:image/png;base64,", page)) == 6
    assert "http://" not in page and "https://" not in page
    md = open(paths["md"]).read()
    for row in render._rows(report[0]):
        assert "| " + " | ".join(row) + " |" in md


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_report_renders_in_headless_chromium(report):
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install Debian's chromium (.ci/run does)")
        pytest.skip("Debian's chromium is not installed on this machine (.ci/run installs it for CI)")
    _, paths, out = report
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={os.path.join(out, 'chromium-profile')}", "--virtual-time-budget=5000"]
    url = "file://" + os.path.abspath(paths["html"])
    dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    status = re.search(r'<div id="status">images (\d+)/(\d+), tables (\d+) rows</div>', dom)
    assert status, dom[-2000:]
    loaded, total, rows = map(int, status.groups())
    assert loaded == total == 6 and rows >= 4
    shot = os.path.join(REPO, "docs", "compare_screenshot.png") if os.environ.get("JAXDP_SAVE_SCREENSHOT") \
        else os.path.join(out, "screenshot.png")
    subprocess.run(flags + ["--window-size=1200,2400", f"--screenshot={shot}", url], capture_output=True, timeout=120)
    assert os.path.getsize(shot) > 50_000  # a rendered page, not a blank one


def test_compare_refuses_a_strategy_one_framework_lacks(capsys):
    assert cli.main(["compare", "--strategies", "ddp,ddp-pmap", "--devices", "2"]) == 2
    assert "strategy 'ddp-pmap' is missing in torch_ref" in capsys.readouterr().err
    assert cli.main(["compare", "--strategies", "ddp-naive", "--devices", "2"]) == 2
    assert "strategy 'ddp-naive' is missing in jaxdp" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["train_mlp_digits.py", "train_gpt_text.py", "compare_frameworks.py",
                                    "multi_process.py"])
def test_examples_run(script, tmp_path):
    argv = [sys.executable, os.path.join(REPO, "examples", script), "--quick"]
    if script == "compare_frameworks.py":
        argv += ["--out", str(tmp_path / "report")]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
    assert out.returncode == 0, out.stderr[-3000:]
    expect = {"train_mlp_digits.py": "of the digits correctly", "train_gpt_text.py": "holds per device",
              "compare_frameworks.py": "parity pass", "multi_process.py": "param  "}[script]
    assert expect in out.stdout, out.stdout
