"""Every `python -m` entry point of both packages answers `--help` with its usage and status 0, run in this
process (`runpy`, as `python -m` runs it): the commands, the mutation score and the measured matrices."""
from __future__ import annotations

import runpy
import sys

import pytest

ENTRY_POINTS = ["jaxdp", "torch_ref", "jaxdp.harness.mutations", "jaxdp.harness.mutations.honest",
                "jaxdp.harness.mutations.limits"]


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_is_the_usage_and_status_0(module, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    with pytest.raises(SystemExit) as e:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert e.value.code in (0, None)
    assert capsys.readouterr().out.startswith("usage: ")
