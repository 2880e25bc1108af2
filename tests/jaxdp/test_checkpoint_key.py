"""A key for the manifests (`JAXDP_CHECKPOINT_KEY`, jaxdp/core/files/manifest_key.py) through both frameworks:
a run saved with the key resumes with it; weights changed and the manifest recomputed without the key are
refused by `--resume` with the key set (one line, exit 3, naming the newest intact step), and taken
without it (the manifest alone is a checksum: docs/RELIABILITY.md, "What the manifest is").

Cost: one tiny checkpointed run and one resumed step per framework, the rest refusals before any step."""
from __future__ import annotations

import os

import pytest

from jaxdp import train as jax_train
from jaxdp.core.files import manifest, manifest_key
from jaxdp.harness import cli, torch_cli
from tests.jaxdp.test_checkpoint_trust import FLAGS, JAX, TORCH, cli_line, copy, flip, largest_data_file


def _run(framework, cfg):
    from jaxdp.harness import torch_run

    return jax_train.run(cfg, progress=False) if framework == "jax" else torch_run.run(cfg)


@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_a_keyed_run_refuses_weights_changed_without_the_key(framework, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(manifest_key.ENV, "the user's key")
    folder = str(tmp_path / "ck")
    cfg = (JAX if framework == "jax" else TORCH).replace(checkpoint_dir=folder, checkpoint_every=1)
    _run(framework, cfg)
    step = os.path.join(folder, "2")
    changed = copy(folder, tmp_path, "changed")
    victim = largest_data_file(step) if framework == "jax" else "__0_0.distcp"
    flip(os.path.join(changed, "2", victim), 0.5)
    with monkeypatch.context() as m:  # someone without the key recomputes the manifest
        m.delenv(manifest_key.ENV)
        manifest.write(os.path.join(changed, "2"), framework, 2)
    main = cli.main if framework == "jax" else torch_cli.main
    argv = ["train", *FLAGS, "--devices", "2" if framework == "jax" else "1", "--checkpoint-dir", changed, "--resume"]
    code, err = cli_line(main, argv, capsys)
    assert code == 3 and "carries no MAC" in err and "newest intact step is 1" in err, err
    monkeypatch.setenv(manifest_key.ENV, "another key")  # step 1, honest, is not vouched for under it either
    code, err = cli_line(main, argv, capsys)
    assert code == 3 and "no earlier step is intact" in err, err
    assert "MAC does not match" in manifest.problem(os.path.join(changed, "1"))
    monkeypatch.delenv(manifest_key.ENV)
    assert manifest.problem(os.path.join(changed, "2")) is None  # without the key: taken (a checksum only)
    monkeypatch.setenv(manifest_key.ENV, "the user's key")
    _run(framework, cfg.replace(steps=3, resume=True))  # the honest folder resumes under its key
