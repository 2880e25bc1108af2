"""Every `python -m` entry point of both packages answers `--help` with its usage and status 0, run in this
process (`runpy`, as `python -m` runs it): the commands, the mutation score and the measured matrices."""
from __future__ import annotations

import runpy
import sys

import pytest

ENTRY_POINTS = ["jaxdp", "torch_ref", "tests.mutations", "tests.mutations.honest",
                "tests.mutations.limits"]


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_is_the_usage_and_status_0(module, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    with pytest.raises(SystemExit) as e:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert e.value.code in (0, None)
    assert capsys.readouterr().out.startswith("usage: ")


@pytest.mark.parametrize("module", ["jaxdp", "torch_ref"])
def test_version_is_the_packages(module, monkeypatch, capsys):
    """`jaxdp --version`, `python -m torch_ref --version`: the name and the version pyproject.toml gives."""
    import tomllib

    import jaxdp
    import torch_ref
    from tests import REPO

    with open(f"{REPO}/pyproject.toml", "rb") as f:
        version = tomllib.load(f)["project"]["version"]
    assert jaxdp.__version__ == torch_ref.__version__ == version
    monkeypatch.setattr(sys, "argv", [module, "--version"])
    with pytest.raises(SystemExit) as e:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert e.value.code in (0, None)
    assert capsys.readouterr().out == f"{module} {version}\n"
