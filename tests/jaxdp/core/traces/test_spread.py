"""Rank spread (jaxdp/core/traces/spread.py): a trace's `step/<k>/spread/<name>` read back by `trace.diff`, the judge
(`parity.judge`) and `jaxdp diff`, on synthetic traces: a nonzero parameter spread fails, a buffer's fails
unless meta `broadcast_buffers` (then a note), NaN always fails, zero is silent, and spread keys held by one
trace only are not a key mismatch. (Real runs: tests/torch_ref/test_torch_batchnorm.py.)"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from jaxdp.core.traces import spread, trace
from jaxdp.harness import cli, cli_diff
from jaxdp.judge import divergence, parity

STEPS = 3


def reference() -> trace.Trace:
    """A two-tensor model with a running mean, plain SGD, float64."""
    rng = np.random.default_rng(5)
    arrays = {"init/dense/kernel": rng.standard_normal((3, 2)), "state/bn/mean": np.zeros(2)}
    for k in range(1, STEPS + 1):
        before = arrays["init/dense/kernel" if k == 1 else f"step/{k - 1}/param/dense/kernel"]
        arrays[f"step/{k}/loss"] = np.asarray(1.0 / k)
        arrays[f"step/{k}/grad/dense/kernel"] = rng.standard_normal((3, 2))
        arrays[f"step/{k}/param/dense/kernel"] = before - 0.1 * arrays[f"step/{k}/grad/dense/kernel"]
        arrays[f"step/{k}/state/bn/mean"] = rng.standard_normal(2)
    return trace.Trace({"dtype": "float64", "optimizer": "sgd", "lr": 0.1}, arrays)


def with_spread(t: trace.Trace, values: dict, **meta) -> trace.Trace:
    """`t` as a 2-rank run writes it: every tensor's spread 0 at every step, except `values` {(step, name): v}."""
    names = ["dense/kernel", "bn/mean"]
    arrays = dict(t.arrays) | {f"step/{k}/spread/{n}": np.float64(values.get((k, n), 0.0))
                               for k in range(1, STEPS + 1) for n in names}
    return trace.Trace({**t.meta, **meta}, arrays)


REF = reference()


def test_zero_spread_is_silent_and_spread_keys_on_one_side_are_no_mismatch():
    a = with_spread(REF, {})
    assert spread.findings(a, "a") == []
    row = parity.judge(a, REF)
    assert row.ok and row.diff["spread"] == [], row.failures
    assert divergence.compare(a, REF).ok and divergence.compare(REF, a).ok


def test_a_parameter_spread_fails_naming_tensor_spread_and_step():
    a = with_spread(REF, {(2, "dense/kernel"): 3e-4, (3, "dense/kernel"): 1e-3}, broadcast_buffers=True)
    (f,) = spread.findings(a, "a")
    assert (f.kind, f.name, f.spread, f.step, f.first, f.fails) == ("parameter", "dense/kernel", 1e-3, 3, 2, True)
    row = parity.judge(a, REF, sides=("ddp", "single"))
    assert not row.ok and row.failures == [f"spread: {row.diff['spread'][0].describe()}"]
    assert row.failures[0].startswith("spread: ddp: parameter dense/kernel differs across ranks by up to 0.001 at "
                                      "step 3 (nonzero from step 2): the ranks disagree on a value the strategy "
                                      "holds replicated")


@pytest.mark.parametrize("broadcast", [False, True])
def test_a_buffer_spread_fails_unless_ddp_broadcasts_rank_0s_buffers(broadcast):
    a = with_spread(REF, {(1, "bn/mean"): 0.02}, **({"broadcast_buffers": True} if broadcast else {}))
    report = divergence.compare(a, REF)
    (f,) = report.spread
    assert (f.kind, f.step, f.fails) == ("buffer", 1, not broadcast)
    assert report.ok == broadcast and parity.judge(a, REF).ok == broadcast
    text = cli_diff.text(report)
    where = "note: " if broadcast else "MISMATCH:\n  "
    assert f"{where}spread: A: buffer bn/mean differs across ranks by up to 0.02 at step 1: " in text
    assert "convert_sync_batchnorm" in text
    assert ("rank 0's at the next step's first forward" in text) == broadcast
    assert ("the recorded state is not the run's" in text) == (not broadcast)


def test_nan_is_never_agreement():
    a = with_spread(REF, {(2, "bn/mean"): math.nan}, broadcast_buffers=True)
    (f,) = spread.findings(a, "a")
    assert f.fails and f.step == 2 and math.isnan(f.spread)
    row = parity.judge(a, REF)
    assert not row.ok and "is not finite on some rank at step 2 (spread NaN)" in row.failures[0]
    assert not any(k.startswith("non-finite") for k in row.failures)  # one finding, not a key mismatch too


def test_diff_reports_the_spread_of_either_trace():
    b = with_spread(REF, {(3, "dense/kernel"): 5e-5})
    d = trace.diff(REF, b)
    assert [(f.side, f.name) for f in d["spread"]] == [("b", "dense/kernel")]
    assert "SPREAD: b: parameter dense/kernel: the ranks differ by up to 5e-05 at step 3" in trace.format_diff(d)


def test_the_diff_command_and_its_json(tmp_path, capsys):
    a = with_spread(REF, {(2, "dense/kernel"): 1e-3})
    paths = {}
    for name, t in (("a", a), ("b", REF)):
        paths[name] = str(tmp_path / f"{name}.npz")
        trace.save(paths[name], t.meta, t.arrays)
    out = tmp_path / "d.json"
    assert cli.main(["diff", paths["a"], paths["b"], "--json", str(out)]) == 1
    assert "spread: A: parameter dense/kernel differs across ranks by up to 0.001 at step 2" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert not doc["ok"] and doc["spread"][0]["name"] == "dense/kernel" and doc["spread"][0]["step"] == 2
