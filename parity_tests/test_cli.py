"""`jaxdp parity`: the same comparison from the command line, a table, and the exit status."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jaxdp.core.process import xla_flags
from jaxdp.core.traces import trace
from jaxdp.harness import cli, pair_runs
from jaxdp.judge import parity
from tests.helpers import as_trace, with_grads, with_update, with_value

from .cases import BF16, FLOAT32, FLOAT64
from .conftest import jax_run, sides, torch_runs


def test_parity_command_prints_the_table_and_exits_zero():
    argv = [sys.executable, "-m", "jaxdp", "parity", "--strategies", "zero2,ddp-naive", "--devices", "2",
            "--steps", "3", "--batch-size", "8", "--hidden", "8", "--dtype", "float64", "--optimizer", "adam"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                         env=xla_flags.for_child(os.environ))
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert any(line.startswith("zero2") and line.rstrip().endswith("ok") for line in lines), out.stdout
    assert any(line.startswith("ddp/ddp-naive") for line in lines), out.stdout
    assert "tolerance (float64): loss 1e-12" in out.stdout


def test_parity_command_exits_non_zero_on_a_mismatch(monkeypatch, capsys):
    label, cfg = FLOAT64[0]
    jcfg, tcfg = sides(label, cfg)
    j, t = jax_run(jcfg), torch_runs()[tcfg]
    bad = dict(j.arrays)
    bad["step/2/grad/layers/0/bias"] = bad["step/2/grad/layers/0/bias"] * 2
    row = parity.compare(trace.Trace(j.meta, bad), trace.Trace(t.meta, t.arrays), jcfg, label)
    monkeypatch.setattr(pair_runs, "check", lambda base, pairs: [row])
    code = cli.main(["parity", "--strategies", label, "--devices", str(cfg.devices)])
    assert code == 1
    assert "MISMATCH: grad" in capsys.readouterr().out


def test_parity_command_names_the_side_that_lacks_a_strategy(capsys):
    assert cli.main(["parity", "--strategies", "ddp-naive~ddp-naive"]) == 2
    assert "strategy 'ddp-naive' exists only in torch_ref; jaxdp has" in capsys.readouterr().err


def saved_pair(tmp_path, case, edit=None):
    """The jaxdp and torch_ref traces of a parity case, written as files (the jax one edited)."""
    jcfg, tcfg = sides(*case)
    j, t = as_trace(jax_run(jcfg)), as_trace(torch_runs()[tcfg])
    j = edit(j) if edit else j
    for name, tr in (("jax", j), ("torch", t)):
        trace.save(tmp_path / f"{name}.npz", tr.meta, tr.arrays)
    return str(tmp_path / "jax.npz"), str(tmp_path / "torch.npz")


@pytest.mark.parametrize("case", [FLOAT32[1], BF16[0]], ids=["float32-adam", "bfloat16-adam"])
def test_diff_applies_the_parity_bounds_and_exits_zero_on_an_honest_pair(tmp_path, case, capsys):
    assert cli.main(["diff", *saved_pair(tmp_path, case)]) == 0
    out = capsys.readouterr().out
    assert "tolerance (" + case[1].dtype + ")" in out and out.rstrip().endswith("ok")
    assert out.startswith("first divergence: none\n")
    header = next(line for line in out.splitlines() if line.startswith("field "))
    for column in ("relative", "norm", "elementwise", "ulp"):
        assert column in header


EDITS = {
    "nan-grad": (FLOAT32[1], lambda t: with_value(t, "step/4/grad/layers/1/kernel", float("nan")),
                 "non-finite: step/4/grad/layers/1/kernel holds NaN or Inf in A",
                 "first divergence: step 4, grad, layers/1/kernel at [0, 0]: A nan"),
    "negated-final-float32-update": (FLOAT32[1], lambda t: with_update(t, t.steps, -1.0), "step update",
                                     f"first divergence: step {FLOAT32[1][1].steps}, param, "),
    "doubled-bf16-gradients": (BF16[0], lambda t: with_grads(t, 7, 2.0), "grad", "first divergence: step 7, grad, "),
}


@pytest.mark.parametrize("edit", EDITS)
def test_diff_exits_one_on_a_wrong_trace_without_a_tolerance(tmp_path, edit, capsys):
    """Issue 13's bar: each of these passed `jaxdp diff` (exit 0) before the parity bounds applied; and
    the first divergence is the planted step (issue 14)."""
    case, change, expected, first = EDITS[edit]
    assert cli.main(["diff", *saved_pair(tmp_path, case, change)]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and expected in out, out
    assert out.startswith(first), out


def test_diff_with_a_tolerance_keeps_its_meaning_and_fails_on_nan(tmp_path, capsys):
    a, b = saved_pair(tmp_path, FLOAT32[1])
    assert cli.main(["diff", a, b, "--tolerance", "1e-3"]) == 0
    assert cli.main(["diff", a, b, "--tolerance", "1e-9"]) == 1
    a, b = saved_pair(tmp_path, FLOAT32[1], lambda t: with_value(t, "step/1/param/layers/0/bias", float("nan")))
    assert cli.main(["diff", a, b, "--tolerance", "1e3"]) == 1
    assert "NON-FINITE: step/1/param/layers/0/bias holds NaN or Inf in a" in capsys.readouterr().out
