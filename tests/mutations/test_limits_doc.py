"""docs/LIMITS.md's detection-limit table is the rendering of the results file that
`python -m tests.mutations.limits` writes (docs/results/limits.json), and the file covers every
family the tests use, in float64 and float32, every honest pair passing."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest

from tests.mutations import hf_models, limits_doc

FAMILIES = {"mlp", "gpt", "gpt2", "llama", "cnn"} | {f"hf-{m}" for m in hf_models.FAMILIES}  # every family tested


@pytest.mark.quick
def test_the_docs_table_is_the_rendering_of_the_results_file():
    with open("docs/LIMITS.md") as f:
        assert limits_doc.section(f.read()) == limits_doc.render(limits_doc.load())


@pytest.mark.quick
def test_the_results_cover_every_family_and_their_honest_pairs_pass():
    rows = limits_doc.load()["rows"]
    assert {(r["family"], r["dtype"]) for r in rows} == {(f, d) for f in FAMILIES for d in ("float64", "float32")}
    assert all(r["honest_ok"] for r in rows)
    assert all(set(r["kinds"]) <= set(limits_doc.KINDS) for r in rows)


@pytest.mark.quick
def test_the_rendering_says_what_was_not_caught():
    results = {"command": "c", "optimizer": "o", "wall_s": 60, "rows": [
        {"family": "f", "dtype": "float32", "honest_ok": True,
         "kinds": {"bias": {"tensor": "b", "lr": 1e-5, "element": math.inf, "grad": 3e-6}}}]}
    table = limits_doc.render(results)
    assert "| f | bias (`b`) | 1e-05 | not caught | 3e-06 |" in table and "f float32 pass" in table


@pytest.mark.quick
def test_a_family_it_does_not_know_is_bad_input():
    done = subprocess.run([sys.executable, "-m", "tests.mutations.limits", "--families", "resnet50"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "'resnet50'" in done.stderr and len(done.stderr.strip().splitlines()) == 1
