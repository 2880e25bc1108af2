"""`jaxdp.diff` and what it judges without help: a trace that lacks the optimizer's settings is judged
by its gradients' disagreement (jaxdp/harness/unmodelled.py) and the verdict says in one line what is
missing; a resumed trace is judged over the steps it shares with the full run; after the first
divergence the relaxed tensors are a count. Each check in both directions: honest pairs pass, planted
bugs fail. Synthetic traces (tests/test_error_model.py's AdamW runs, tests/test_divergence.py's user
trace), no training."""
from __future__ import annotations

import numpy as np
import pytest

from jaxdp.core import trace
from jaxdp.harness import divergence

from .test_error_model import BUGS, run

SETTINGS = ("optimizer", "lr", "weight_decay")


def unrecorded(t: trace.Trace) -> trace.Trace:
    """`t` as the porting recipe used to record it: meta without the optimizer's settings."""
    return trace.Trace({k: v for k, v in t.meta.items() if k not in SETTINGS}, t.arrays)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_honest_runs_without_the_optimizer_settings_pass_and_say_what_is_missing(dtype):
    report = divergence.compare(unrecorded(run(dtype, 1)), unrecorded(run(dtype, 2)), check_config=False)
    assert report.ok, report.failures
    missing = [n for n in report.notes if "optimizer settings not recorded" in n]
    assert len(missing) == 1 and "'optimizer' and 'lr'" in missing[0] and "Recorder(..., optimizer=" in missing[0]
    assert {r.split(", ")[2].split(" at")[0] for r in report.relaxed} == {"attn/bias"}  # the roundoff-only bias


@pytest.mark.parametrize("bug", BUGS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_small_bugs_fail_without_the_optimizer_settings(bug, dtype):
    report = divergence.compare(unrecorded(run(dtype, 1, **BUGS[bug])), unrecorded(run(dtype, 2)),
                                check_config=False)
    assert not report.ok, bug
    assert report.first.field == "param", report.first.describe()


def test_identical_gradients_leave_no_allowance():
    a = unrecorded(run(run_seed=1))
    arrays = dict(a.arrays)
    arrays["step/3/param/wte"] = arrays["step/3/param/wte"] + 1e-9  # past the storage rounding
    report = divergence.compare(trace.Trace(a.meta, arrays), a, check_config=False)
    assert not report.ok and (report.first.step, report.first.name) == (3, "wte")
