"""compare --target's "Compiled for the H100" rows (report/target_rows.py): the peak as compiled, the step and
MFU as ranges to the figures they support, the points they rest on; and the cluster efficiencies of the
projection table to one significant figure (units.efficiency): modelled, never printed as if measured."""
from __future__ import annotations

from jaxdp.analysis import calibration
from jaxdp.harness.report import render, target_rows, units


def _summary(low, high):
    p = {"step_s": 0.5, "step_low_s": low, "step_high_s": high, "mfu": 0.2, "calibrated_on": ["gpt2-124m-mb8"]}
    t = {"devices": 8, "nodes": 1, "peak_bytes": 2**30, "fits": True, "projection": p}
    return {"target": {"name": "h100"}, "strategies": [{"name": "zero3", "target": t}, {"name": "ddp"}]}


def test_a_wide_range_prints_one_figure_a_narrow_one_two():
    assert target_rows.rows(_summary(0.4, 0.6)) == [["zero3", "8 (1)", "1 GiB", "yes", "400-600", "10-30",
                                                     "gpt2-124m-mb8"]]
    assert target_rows.rows(_summary(0.48, 0.52))[0][4:6] == ["480-520", "19-21"]
    assert calibration.span(0.5, 0.5, 1e3) == "500" and calibration.rounded(0.0437, 1) == "0.04"
    assert calibration.span(0.1 / 0.6, 0.1 / 0.4, 100) == "10-30"  # 16.7-25%: the printed range holds it


def test_the_report_has_the_section_only_with_a_target():
    md = target_rows.markdown(_summary(0.4, 0.6), render._table_md)
    assert "## Compiled for the H100" in md and any(line.startswith("- modelled:") for line in md)
    assert target_rows.markdown({"strategies": [{"name": "ddp"}]}, render._table_md) == []
    assert "Compiled for the H100" in target_rows.as_html(_summary(0.4, 0.6), render._table_html)


def test_cluster_efficiencies_are_one_significant_figure():
    assert [units.efficiency(x) for x in (0.397, 0.0397, 0.97)] == ["0.4", "0.04", "1"]
    assert all("modelled" in h for h in render.PROJECTION_HEADER[-2:] + render.LINKS_HEADER[-2:])
