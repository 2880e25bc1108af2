"""The bench's timed runs (jaxdp/harness/bench/measure.py): torch_ref runs a -jit strategy as its twin (the same
torch program), so a world that times the twin does not time the -jit name again; the row says whose run it
repeats, in the JSON (`torch_timed_as`) and in item 1's table."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from jaxdp.harness.bench import tables  # noqa: E402
from jaxdp.harness.bench.markdown import _step_time  # noqa: E402
from jaxdp.harness.bench.measure import timed_as  # noqa: E402
from jaxdp.harness.bench.plan import plan, time_runs  # noqa: E402


def test_a_jit_strategy_repeats_its_twins_run_only_when_the_twin_is_timed():
    assert timed_as(["ddp", "ddp-jit", "zero1-jit", "fsdp-jit", "zero3"]) == {"ddp-jit": "ddp", "fsdp-jit": "zero3"}
    assert timed_as(["ddp-jit", "zero1", "single"]) == {}  # ddp not timed here: ddp-jit runs itself


def test_every_jit_strategy_of_the_full_plan_repeats_its_twin():
    for _, n, cfgs in time_runs(plan(False)):
        names = [c.strategy for c in cfgs]
        jit = {s for s in names if s.endswith("-jit")}
        assert set(timed_as(names)) == jit, (n, names)


def test_the_repeated_row_says_whose_run_it_is():
    entry = {"strategy": "ddp", "devices": 2, "median_step_s": 0.01, "p25_step_s": 0.01, "p75_step_s": 0.01,
             "loss_last": 1.0}
    times = {"mlp": {"jax": {"ddp-jit@2": {**entry, "strategy": "ddp-jit"}},
                     "torch": {"ddp-jit@2": {**entry, "strategy": "ddp-jit", "timed_as": "ddp"}}}}
    rows = tables.step_time_table(times)
    assert rows[0]["torch_timed_as"] == "ddp"
    assert "(its twin ddp's run)" in "\n".join(_step_time({"step_time": {"rows": rows}}))
