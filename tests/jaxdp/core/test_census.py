"""jaxdp/core/census.py: a census keeps only the sites below its run's dtype, caps them with each kind of site
first, and describes them by class and module in one phrase."""
from __future__ import annotations

import pytest

from jaxdp.core import census


@pytest.mark.quick
def test_only_lower_sites_are_kept_and_the_lowest_is_seen():
    counts = {("m.norm", "RMSNorm", "rsqrt", "float32", "forward"): 2,
              ("m.fc", "Linear", "mm", "float64", "forward"): 5}
    c = census.summary("float64", counts, {"float64", "float32"})
    assert (c["lowest"], c["total"], c["ops"]) == ("float32", 1, 2)
    assert c["sites"] == [{"module": "m.norm", "class": "RMSNorm", "op": "rsqrt", "dtype": "float32",
                           "phase": "forward", "count": 2}]
    assert census.summary("bfloat16", {("a", "A", "mul", "bfloat16", "forward"): 1})["sites"] == []
    assert census.lower("bfloat16", "float32") and not census.lower("float64", "float32")


@pytest.mark.quick
def test_the_cap_keeps_every_kind_of_site_first():
    counts = {(f"layers.{i}.norm", "RMSNorm", "mul", "float32", "forward"): 9 for i in range(100)}
    counts[("attn", "Attention", "_softmax", "float32", "forward")] = 1
    c = census.summary("float64", counts)
    assert len(c["sites"]) == census.MAX_SITES and c["total"] == 101
    assert {s["class"] for s in c["sites"]} == {"RMSNorm", "Attention"}


@pytest.mark.quick
def test_describe_names_classes_and_modules():
    counts = {("m.layers.0.norm", "RMSNorm", "rsqrt", "float32", "forward"): 1,
              ("m.layers.1.norm", "RMSNorm", "rsqrt", "float32", "forward"): 1,
              ("m.attn", "Attention", "_softmax", "float32", "backward"): 1}
    text = census.describe(census.summary("float64", counts))
    assert text.startswith("3 float32 sites (RMSNorm at m.layers.0.norm and 1 more (rsqrt); Attention at m.attn")
    assert census.describe(None) == "" and census.lower_sites({"dtype": "float64", "sites": "junk"}) == []
