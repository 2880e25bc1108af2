"""`python -m torch_ref train --processes P`: jaxdp's flag, where a rank is a process holding one device, so P
must be --devices N (N ranks are N processes); otherwise one line, status 2, naming the fix and torchrun."""
from __future__ import annotations

import pytest

from jaxdp.harness import torch_cli

pytest.importorskip("torch")
RUN = ["train", "--strategy", "ddp", "--steps", "1", "--hidden", "8,8", "--batch-size", "8"]


def test_processes_equal_to_devices_runs_n_ranks(monkeypatch):
    from jaxdp.harness import torch_run

    ran = []
    monkeypatch.setattr(torch_run, "run", lambda cfg, **k: ran.append(cfg.devices))
    assert torch_cli.main([*RUN, "--processes", "2", "--devices", "2"]) == 0
    assert ran == [2]


@pytest.mark.parametrize("extra, env, line", [
    (["--devices", "4"], {}, "--processes 2 with --devices 4: a torch_ref rank is one process holding one device, "
     "so --devices N starts N processes: give --devices 2 (or drop --processes); for several hosts, torchrun "
     "--nnodes H --nproc-per-node N/H -m torch_ref train ..."),
    (["--devices", "4"], {"WORLD_SIZE": "4", "RANK": "0"}, "--processes 2: under torchrun the processes are "
     "torchrun's (--nnodes, --nproc-per-node): drop --processes"),
])
def test_other_processes_are_one_line(extra, env, line, monkeypatch, capsys):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert torch_cli.main([*RUN, "--processes", "2", *extra]) == 2
    assert capsys.readouterr().err == f"torch_ref: error: {line}\n"
