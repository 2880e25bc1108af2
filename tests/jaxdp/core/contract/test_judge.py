"""The judge on hand-made collectives: each rule fires on its departure and stays silent on the textbook,
at the halfway thresholds (judge.py's docstring), in both directions."""
from __future__ import annotations

import json

import pytest

from jaxdp.core.contract import judge
from jaxdp.core.contract.intent import Intent
from jaxdp.core.contract.report import Comm, Report

pytestmark = pytest.mark.quick
P, D = 1000, 4


def comm(op, elements=P, count=1, dtype="f32", group=D, overlaps=None, axis="data"):
    return Comm(op, dtype, elements, 4 * elements, axis, group, count, overlaps)


def kinds(comms, intent="ddp", accumulation=1, state=None, params=None, reduce_dtype="float32"):
    return [f.kind for f in judge.findings(comms, Intent(intent, accumulation, reduce_dtype), D, P, state, params)]


TEXTBOOK = {
    "ddp": [comm("all-reduce"), comm("all-reduce", 1)],  # the gradient, the loss
    "zero1": [comm("all-reduce"), comm("all-gather")],
    "zero2": [comm("reduce-scatter"), comm("all-gather")],
    "zero3": [comm("all-gather", count=2), comm("reduce-scatter")],
    "hsdp": [comm("all-gather", group=2, count=2), comm("reduce-scatter", group=2), comm("all-reduce", P // 2, group=2,
                                                                                          axis="replica")],
}


@pytest.mark.parametrize("intent", sorted(TEXTBOOK))
def test_the_textbook_passes(intent):
    sharded = None if intent == "ddp" else True
    assert kinds(TEXTBOOK[intent], intent, state=sharded, params=intent in ("zero3", "hsdp")) == []


@pytest.mark.parametrize("comms,intent,kw,kind", [
    ([], "ddp", {}, "no-gradient-sync"),
    ([comm("all-reduce", group=2, axis="data")], "ddp", {}, "wrong-axis"),
    ([comm("all-reduce", count=4)], "ddp", {"accumulation": 4}, "sync-per-microbatch"),
    ([comm("all-reduce", count=2)], "ddp", {}, "extra-gradient-sync"),
    ([comm("all-reduce", dtype="bf16")], "ddp", {}, "reduce-dtype"),
    ([comm("all-reduce", dtype="bf16>f32")], "ddp", {}, "reduce-dtype"),
    ([comm("all-reduce"), comm("all-gather")], "ddp", {}, "unexpected-gather"),
    ([comm("all-reduce")], "zero1", {}, "state-replicated"),
    ([comm("all-reduce"), comm("all-gather")], "zero1", {"state": False}, "state-replicated"),
    ([comm("reduce-scatter")], "zero3", {"params": False}, "params-replicated"),
    ([comm("reduce-scatter"), comm("all-gather", count=3)], "zero3", {"params": True}, "gathered-too-often"),
    ([comm("all-reduce"), comm("all-gather")], "zero2", {"state": True}, "all-reduce-not-scatter"),
    ([comm("all-reduce")], "hsdp", {}, "wrong-axis"),
    ([comm("all-gather", group=2), comm("reduce-scatter", group=2)], "hsdp", {}, "no-replica-sync"),
    ([comm("all-reduce", P // 2, overlaps=False), comm("all-reduce", P // 2, overlaps=False)], "ddp", {},
     "no-overlap"),
])
def test_each_rule_fires_on_its_departure(comms, intent, kw, kind):
    assert kind in kinds(comms, intent, **kw)


def test_the_thresholds_sit_halfway():
    """A sync of 1.4 P is once (padding, a tied weight); 1.6 P twice; a scalar is never the gradient."""
    assert kinds([comm("all-reduce", int(1.4 * P))]) == []
    assert kinds([comm("all-reduce", int(1.6 * P))]) == ["extra-gradient-sync"]
    assert kinds([comm("all-reduce", 1, count=50), comm("all-reduce")]) == []
    assert kinds([comm("all-reduce", P // 2, overlaps=True), comm("all-reduce", P // 2, overlaps=False)]) == []
    assert kinds([comm("all-reduce", dtype="pred", elements=P)]) == ["no-gradient-sync"]  # a flag, not a gradient


def test_one_device_expects_nothing():
    assert judge.findings([], Intent("zero3"), 1, P) == []


def test_the_report_renders_as_text_and_json():
    r = Report("ddp", [comm("all-reduce", count=2)], judge.findings([comm("all-reduce", count=2)], Intent("ddp"), D, P),
               {"devices": D, "param_elements": P, "bytes_per_step": 12000.0, "theory_bytes_per_step": 6000.0})
    data = json.loads(r.to_json())
    assert data["ok"] is False and data["findings"][0]["kind"] == "extra-gradient-sync"
    assert set(data["findings"][0]) == {"kind", "message", "fix"}
    text = r.to_text()
    assert "DEPARTS [extra-gradient-sync]" in text and "; fix: " in text and "(textbook 6000)" in text


def _outer(branch: bool, inner_steps: int) -> list[str]:
    params = Comm("all-reduce", "f32", P, 4 * P, "data", D, 1, None, "", branch)
    return [f.kind for f in judge.findings([params, comm("all-reduce", 1)], Intent("diloco", inner_steps=inner_steps),
                                           D, P, False, False)]


def test_diloco_all_reduces_the_parameters_in_the_outer_branch_only():
    """K > 1: the parameters' all-reduce in a conditional's branch is diloco's textbook; on every step (no
    branch) it is `sync-every-step`. K = 1: every step is the outer step (ddp's traffic), no finding."""
    assert _outer(branch=True, inner_steps=4) == []
    assert _outer(branch=False, inner_steps=4) == ["sync-every-step"]
    assert _outer(branch=False, inner_steps=1) == []
