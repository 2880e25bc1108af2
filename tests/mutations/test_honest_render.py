"""The honest matrix's results file and its block in docs/PARITY.md: the block is the rendering of the file
(`honest_render.render`), and `--check` / the test fail when either changes alone."""
from __future__ import annotations

import copy
import json
import pathlib

import pytest

from tests.mutations import honest_render

ROOT = pathlib.Path(__file__).resolve().parents[2]


def results_file() -> dict:
    return json.loads((ROOT / honest_render.RESULTS).read_text())


def small() -> dict:
    comparisons = [{"case": "mlp sgd float64 N=2 accum=2 jaxdp ddp~single", "ok": True, "ratios": {"grad": 0.5},
                    "failures": []},
                   {"case": "hf-opt adam bfloat16 N=3 torch_ref zero1~single", "ok": False,
                    "ratios": {"grad": 2.0, "loss": 0.1}, "failures": ["grad 0.5 > 0.25 at step/2/grad/x"]}]
    return {"command": "python -m tests.mutations.honest", "wall_s": 90.0, "machine": "2 CPU cores",
            "promote": False, "families": ["opt"], "sets": {"project": 1, "hf": 1},
            "summary": honest_render.summarise(comparisons, ["loss", "grad"]), "comparisons": comparisons}


@pytest.mark.quick
def test_the_parity_doc_block_is_the_rendering_of_the_results_file():
    doc = (ROOT / honest_render.DOC).read_text()
    assert honest_render.block(doc) == honest_render.render(results_file()), (
        "docs/PARITY.md's honest block is stale: python -m tests.mutations.honest_render")


@pytest.mark.quick
def test_the_results_file_summary_is_its_comparisons_summary():
    res = results_file()
    measures = list(res["summary"]["worst"])
    assert res["summary"] == honest_render.summarise(res["comparisons"], measures)
    assert len(res["families"]) >= 8


@pytest.mark.quick
def test_render_states_counts_worst_ratios_per_dtype_and_each_failure():
    text = honest_render.render(small())
    assert "**2 comparisons, 1 pass, 1 fail**" in text
    assert "| grad | 2 | hf-opt adam bfloat16 N=3 torch_ref zero1~single |" in text
    assert "| float64 | 1 | 1 | grad 0.5 |" in text and "| bfloat16 | 1 | 0 | loss 0.1, grad 2 |" in text
    assert "- hf-opt adam bfloat16 N=3 torch_ref zero1~single: grad 0.5 > 0.25 at step/2/grad/x" in text


@pytest.mark.quick
def test_check_fails_on_a_stale_block_and_passes_once_written(tmp_path):
    res, doc = tmp_path / "r.json", tmp_path / "d.md"
    res.write_text(json.dumps(small()))
    doc.write_text(f"# head\n\n{honest_render.BEGIN}\nold\n{honest_render.END}\n\ntail\n")
    argv = ["--results", str(res), "--doc", str(doc)]
    assert honest_render.main(argv + ["--check"]) == 1
    assert honest_render.main(argv) == 0
    assert honest_render.main(argv + ["--check"]) == 0
    assert doc.read_text().startswith("# head\n\n") and doc.read_text().endswith("\n\ntail\n")
    changed = copy.deepcopy(small())
    changed["comparisons"][0]["ratios"]["grad"] = 0.7
    changed["summary"] = honest_render.summarise(changed["comparisons"], ["loss", "grad"])
    res.write_text(json.dumps(changed))
    assert honest_render.main(argv + ["--check"]) == 1


@pytest.mark.quick
def test_a_doc_without_markers_is_bad_input(tmp_path, capsys):
    res, doc = tmp_path / "r.json", tmp_path / "d.md"
    res.write_text(json.dumps(small()))
    doc.write_text("no markers\n")
    assert honest_render.main(["--results", str(res), "--doc", str(doc)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--doc" in err[0] and "markers" in err[0]
