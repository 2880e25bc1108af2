"""`RunResult.rate()`: the summaries of `jaxdp train` and `python -m torch_ref train` give the steps per second
measured after the first step, or 'n/a' when no step ran after it (a 1-step run printed '0.0 steps/s')."""
from __future__ import annotations

from jaxdp import train
from jaxdp.core.run.results import RunResult
from tests.conftest import BASE


def _summaries(result: RunResult) -> list[str]:
    out = [train.summary(result)]
    try:
        from torch_ref.train import summary
    except ImportError:  # an install without torch: jaxdp's alone
        return out
    return out + [summary(result)]


def test_a_one_step_run_gives_no_rate():
    result = train.run(BASE.replace(steps=1), record=False, progress=False)
    assert result.steps_per_s is None
    for line in _summaries(result):
        assert line.endswith("steps/s after it n/a (no step after the first)") and "0.0 steps/s" not in line, line


def test_a_run_of_two_steps_gives_its_rate():
    result = RunResult(BASE.replace(steps=2), losses=[1.0, 0.5], meta={"platform": "cpu"}, steps_per_s=12.34)
    for line in _summaries(result):
        assert line.endswith("12.3 steps/s after"), line
