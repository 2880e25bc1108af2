"""hsdp with one group (`--replicas 1`, the default) is zero3, and `jaxdp train` and `python -m torch_ref train`
say so in one line on stderr before the run (`hsdp_hosts.one_group`); R > 1 groups, or another strategy: no line."""
from __future__ import annotations

import pytest

from jaxdp.core.run import hsdp_hosts
from jaxdp.harness import cli, torch_cli
from tests.conftest import BASE

LINE = ("note: hsdp with --replicas 1 is one group of all 2 devices: that is zero3 (for R replica groups give "
        "--replicas R, R > 1 dividing --devices)")
RUN = ["--strategy", "hsdp", "--devices", "2", "--steps", "1", "--hidden", "8,8", "--batch-size", "8"]


def test_one_group_is_zero3():
    assert hsdp_hosts.one_group(BASE.replace(strategy="hsdp", devices=2)) == LINE.removeprefix("note: ")
    assert hsdp_hosts.one_group(BASE.replace(strategy="hsdp", devices=4, replicas=2)) is None
    assert hsdp_hosts.one_group(BASE.replace(strategy="zero3", devices=2)) is None


@pytest.mark.parametrize("prog", ["jaxdp", "torch_ref"])
@pytest.mark.parametrize("replicas", ["1", "2"])
def test_train_says_it_once(prog, replicas, monkeypatch, capsys):
    if prog == "torch_ref":
        pytest.importorskip("torch")
        from jaxdp.harness import torch_run

        monkeypatch.setattr(torch_run, "run", lambda *a, **k: None)  # the line comes before any rank starts
        main, argv = torch_cli.main, ["train", *RUN, "--replicas", replicas]
    else:
        main, argv = cli.main, ["train", *RUN, "--replicas", replicas, "--platform", "cpu"]
    if replicas == "2":
        argv[argv.index("--devices") + 1] = "4"
    assert main(argv) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "note:" in line]
    assert notes == ([f"{prog}: {LINE}"] if replicas == "1" else [])
