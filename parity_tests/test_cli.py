"""`jaxdp parity`: the same comparison from the command line, a table, and the exit status."""
from __future__ import annotations

import os
import subprocess
import sys

from jaxdp import cli, parity, trace

from .cases import FLOAT64
from .conftest import jax_run, sides, torch_runs


def test_parity_command_prints_the_table_and_exits_zero():
    argv = [sys.executable, "-m", "jaxdp", "parity", "--strategies", "zero2,ddp-naive", "--devices", "2",
            "--steps", "3", "--batch-size", "8", "--hidden", "8", "--dtype", "float64", "--optimizer", "adam"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
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
    monkeypatch.setattr(parity, "check", lambda base, pairs: [row])
    code = cli.main(["parity", "--strategies", label, "--devices", str(cfg.devices)])
    assert code == 1
    assert "MISMATCH: grad" in capsys.readouterr().out


def test_parity_command_names_the_side_that_lacks_a_strategy(capsys):
    assert cli.main(["parity", "--strategies", "ddp-naive~ddp-naive"]) == 2
    assert "strategy 'ddp-naive' exists only in torch_ref; jaxdp has" in capsys.readouterr().err
