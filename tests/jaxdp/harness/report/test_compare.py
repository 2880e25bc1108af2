"""`jaxdp compare`: the report's files and figures, accounting against theory, the scaling projection
(reference models, the compute-bound criterion), the page in a real headless browser (Chromium), and
the refusals (the examples: tests/examples/test_examples.py)."""
from __future__ import annotations

import importlib.util
import json
import os
import re

import pytest

from jaxdp.harness import cli
from jaxdp.harness.report import paths, plots, projection, references, render, runner
from tests import REPO
from tests.conftest import BASE

CFG = BASE.replace(devices=2, steps=5, batch_size=16, dtype="float32", optimizer="adam", lr=1e-3, weight_decay=0.0)
REPO = REPO


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
        for side in entry["frameworks"].values():  # the in-step peak holds at least the state, both sides
            assert side["peak_bytes"] >= sum(side["memory"].values()) - side["memory"].get("grads", 0) > 0
    ddp = summary["strategies"][0]
    assert ddp["frameworks"]["jax"]["comm"]["total"] == pytest.approx(ddp["theory"]["comm"]["total"], rel=1e-12)
    proj = summary["projection"]
    assert proj["bytes_per_param"]["ddp"] == pytest.approx(ddp["frameworks"]["jax"]["comm"]["total"]
                                                           / proj["run"]["params"], rel=1e-12)
    assert proj["ring_phases"]["ddp"] == pytest.approx(2.0, abs=0.01)  # one all-reduce (+ the loss scalar's)
    assert not proj["run"]["compute_bound"] and list(proj["models"]) == ["GPT-2 124M", "Llama 3 8B"]
    for model in proj["models"].values():
        for rows in (p["rows"] for p in model["strategies"].values()):
            assert [r["n"] for r in rows] == [8, 16, 32, 64, 128, 256, 512, 1024]
            assert all(0.01 < r["weak_efficiency"] <= 1 for r in rows)  # not the toy model's ~1e-5
            assert all(0.01 < r["strong_efficiency"] <= 1 for r in rows if r["n"] <= 512)
            assert rows[-1]["strong_efficiency"] is None  # 512 sequences cannot be split over 1024 GPUs


def test_the_report_names_its_kernel_path(report):
    summary, written, _ = report
    assert [(r["name"], r["kernels"], r["pass"]) for r in summary["paths"]] == [("ddp", "mirrored", True),
                                                                                ("zero3", "mirrored", True)]
    md = open(written["md"]).read()
    assert md.splitlines()[0].endswith("kernels mirrored")
    assert "## Kernel paths" in md and "| ddp | mirrored / mirrored, eager | pass |" in md
    assert "<h2>Kernel paths</h2>" in open(written["html"]).read()


def test_a_further_path_trains_both_frameworks_on_it_and_judges_them():
    """`compare --kernels mirrored,fused`'s second path (runner.run_path), on a tiny gpt."""
    cfg = CFG.replace(model="gpt", data="text", n_layer=1, n_head=2, d_model=16, seq_len=16, batch_size=8,
                      strategy="single", devices=1, steps=3)
    rows = runner.run_path({"single": cfg}, "fused", lambda m: None)
    assert [(r["name"], r["kernels"], r["torch_compiled"], r["pass"]) for r in rows] == [("single", "fused", False,
                                                                                           True)]
    assert rows[0]["jax"]["median_step_s"] > 0 and rows[0]["torch"]["median_step_s"] > 0
    assert "| single | fused / fused, eager | pass |" in "\n".join(render._table_md(
        paths.HEADER, paths.table_rows({"paths": rows})))


def test_html_is_self_contained_and_markdown_has_the_same_table(report):
    _, paths, _ = report
    page = open(paths["html"]).read()
    assert len(re.findall(r"<img [^>]*src='data:image/png;base64,", page)) == 6
    assert "http://" not in page and "https://" not in page
    md = open(paths["md"]).read()
    for row in render._rows(report[0]) + render._projection_rows(report[0]):
        assert "| " + " | ".join(row) + " |" in md
    assert "GPT-2 124M" in page and "Llama 3 8B" in page and "not compute-bound" in page


@pytest.mark.parametrize("model, published", [(references.GPT2_124M, 124e6), (references.LLAMA3_8B, 8.03e9)])
def test_reference_parameter_counts_match_the_published_ones(model, published):
    assert references.params(model) == pytest.approx(published, rel=0.01)
    attention = 12 * model.n_layer * model.d_model * model.context
    assert references.flops_per_token(model) == 6 * references.params(model) + attention


def test_reference_parameter_counts_exactly():
    """Counted by hand from the shapes: GPT-2 12 x 7,087,872 + 38,597,376 + 786,432 + 1,536; Llama 3 8B
    32 x 218,112,000 + 2 x 525,336,576 + 4,096."""
    assert references.params(references.GPT2_124M) == 124_439_808
    assert references.params(references.LLAMA3_8B) == 8_030_261_248


def _report_projection(flops_per_sample, params, devices=4, batch=64):
    """A float32 run on 4 devices: ddp's all-reduce sends 2 x 3/4 x 4 bytes per parameter, zero3's
reduce-scatter and two all-gathers 3 x 3/4 x 4."""
    return projection.for_report({"ddp": 6.0 * params, "zero3": 9.0 * params}, params, 4, flops_per_sample,
                                 devices, batch, "gpt")


def test_toy_model_is_not_projected():
    proj = _report_projection(flops_per_sample=4e4, params=7_000)
    assert not proj["run"]["compute_bound"] and proj["run"]["compute_s"] < proj["run"]["comm_s"]
    assert list(proj["models"]) == ["GPT-2 124M", "Llama 3 8B"]
    assert proj["bytes_per_param"] == {"ddp": 6.0, "zero3": 9.0}
    assert proj["ring_phases"] == pytest.approx({"ddp": 2.0, "zero3": 3.0})
    assert "(gpt, 7,000 parameters) is not drawn: not compute-bound" in plots.scaling_caption(proj)


def test_compute_bound_model_is_projected_beside_the_references(tmp_path):
    params = 100_000_000  # a GPT-2-sized run: 16 sequences of 1024 tokens per device
    proj = _report_projection(flops_per_sample=6 * params * 1024, params=params)
    assert proj["run"]["compute_bound"] and proj["run"]["compute_s"] >= proj["run"]["comm_s"]
    assert list(proj["models"]) == ["GPT-2 124M", "Llama 3 8B", "this run (gpt)"]
    weak8 = proj["models"]["this run (gpt)"]["strategies"]["ddp"]["rows"][0]["weak_efficiency"]
    assert 0.5 <= weak8 <= 1  # the criterion, read as an efficiency
    assert "model (gpt) is drawn too: compute-bound" in plots.scaling_caption(proj)
    assert [r[0] for r in render._projection_rows({"projection": proj})].count("this run (gpt)") == 2
    assert os.path.getsize(plots.scaling({"projection": proj}, str(tmp_path / "scaling.png"))) > 10_000


def test_criterion_boundary_is_compute_equal_to_communication():
    ddp, both, phases = {"ddp": 6.0e6}, {"ddp": 6.0e6, "zero3": 9.0e6}, {"ddp": 2.0, "zero3": 3.0}
    comm = projection.compute_bound(1.0, ddp, 4, 1, phases)["comm_s"]
    flops_s = projection.H100_NVLINK_IB.peak_flops * projection.H100_NVLINK_IB.mfu
    assert projection.compute_bound(comm * flops_s * 1.001, ddp, 4, 1, phases)["compute_bound"]
    assert not projection.compute_bound(comm * flops_s * 0.999, ddp, 4, 1, phases)["compute_bound"]
    # every strategy must be compute-bound: the one that sends most decides
    assert not projection.compute_bound(comm * flops_s * 1.001, both, 4, 1, phases)["compute_bound"]


def _screenshot_script():
    """scripts/screenshot_report.py, which regenerates docs/compare_screenshot.png (its Chromium helpers)."""
    spec = importlib.util.spec_from_file_location("screenshot_report", os.path.join(REPO, "scripts",
                                                                                   "screenshot_report.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_report_renders_in_headless_chromium(report):
    shots = _screenshot_script()
    if shots.browser() is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install Debian's chromium (.ci/run does)")
        pytest.skip("Debian's chromium is not installed on this machine (.ci/run installs it for CI)")
    _, paths, out = report
    profile = os.path.join(out, "chromium-profile")
    status, dom = shots.dom_status(paths["html"], profile)
    assert status, dom[-2000:]
    loaded, total, rows = status
    situations = 5  # the run, and two reference models x (one node, 16 nodes)
    assert loaded == total == 6 and rows >= 4 + situations
    assert dom.index("<h2>Which strategy</h2>") < dom.index("<h2>Verdict</h2>")
    assert len(re.findall(r"<td class=\"pick\">", dom)) == situations, dom[:3000]
    shot = shots.screenshot(paths["html"], os.path.join(out, "screenshot.png"), profile)
    assert os.path.getsize(shot) > 50_000  # a rendered page, not a blank one


def test_compare_refuses_a_strategy_one_framework_lacks(capsys):
    assert cli.main(["compare", "--strategies", "ddp,ddp-pmap", "--devices", "2"]) == 2
    assert "strategy 'ddp-pmap' is missing in torch_ref" in capsys.readouterr().err
    assert cli.main(["compare", "--strategies", "ddp-naive", "--devices", "2"]) == 2
    assert "strategy 'ddp-naive' is missing in jaxdp" in capsys.readouterr().err


def test_local_batchnorm_is_a_finding_next_to_the_verdict_not_a_failure():
    """`--batchnorm local` on N > 1 is measured against jaxdp `single` and reported as a difference
    by design; the parity verdict (jaxdp against torch_ref) stays what it is."""
    from jaxdp.core.run.config import RunConfig

    entry = {"parity": {"pass": True}, "vs_single": {"finding": runner.BY_DESIGN, "differs": True,
                                                     "worst": {"grad": 0.29}}}
    assert render.finding(entry) == "; local BatchNorm: differs from single by design (worst grad 2.9e-01 from single)"
    assert render.finding({"parity": {"pass": True}}) == ""
    local = RunConfig(model="cnn", data="digits", batchnorm="local", devices=2)
    assert runner.by_design_reference(local.replace(batchnorm="sync"), print) is None
    assert runner.by_design_reference(local.replace(devices=1), print) is None
