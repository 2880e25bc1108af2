"""Links in `--checkpoint-dir`, through both CLIs (issue 67, item 2): `jaxdp train` and `python -m torch_ref
train` refuse a link in place of the lock, the marker, a step folder, a step's file or subfolder, or the
manifest, in one line, exit 2, naming the link, with `--resume` and with `--overwrite-checkpoints`, and what
the link points to keeps its bytes. Before the fix the lock was truncated to the run's pid and a linked step
received a manifest vouching for someone's files (docs/RELIABILITY.md, "Round two: links in the checkpoint
folder"). The folder rules on a hand-made folder, and links met after the check:
tests/jaxdp/core/files/test_nofollow.py.

Cost: one tiny checkpointed run per framework (the fixtures of test_checkpoint_trust.py), then refusals."""
from __future__ import annotations

import os

import pytest

from jaxdp.core.files import ckpt_folder, manifest
from jaxdp.harness import cli, torch_cli
from tests.jaxdp.core.files.test_nofollow import outside, plant, snapshot
from tests.jaxdp.test_checkpoint_trust import FLAGS, cli_line, copy, jax_ck, torch_ck  # noqa: F401 (fixtures)

PLACES = {"jax": [ckpt_folder.LOCK, ckpt_folder.MARKER, "2", "2/state", "2/_CHECKPOINT_METADATA", f"2/{manifest.NAME}"],
          "torch": [ckpt_folder.LOCK, ckpt_folder.MARKER, "2", "2/.metadata", "2/record.json", f"2/{manifest.NAME}"]}
CASES = [(fw, rel) for fw, rels in PLACES.items() for rel in rels]


@pytest.mark.parametrize("framework,rel", CASES)
def test_both_clis_refuse_a_link_in_the_folder_and_follow_none(framework, rel, request, tmp_path, capsys):
    source = request.getfixturevalue("jax_ck" if framework == "jax" else "torch_ck")
    folder = copy(source, tmp_path, "ck")
    mine, before = outside(str(tmp_path))
    if rel == ckpt_folder.LOCK and not os.path.lexists(os.path.join(folder, rel)):
        open(os.path.join(folder, rel), "w").close()
    target = os.path.join(folder, rel)
    kind = "folder" if os.path.isdir(target) else "file"
    if kind == "folder":  # a copy of the step outside: followed, it would be resumed as it is
        copy(target, tmp_path / "mine", "step")
        os.remove(os.path.join(mine, "data.bin"))
        mine, before = os.path.join(mine, "step"), snapshot(os.path.join(mine, "step"))
        os.rename(target, target + ".x")
        os.symlink(mine, target)
    else:
        path = plant(folder, rel, kind, mine)
        assert path == target
    main = cli.main if framework == "jax" else torch_cli.main
    argv = ["train", *FLAGS, "--devices", "2" if framework == "jax" else "1", "--checkpoint-dir", folder,
            "--checkpoint-every", "1"]
    for mode in ("--resume", ckpt_folder.OVERWRITE):
        code, err = cli_line(main, [*argv, mode], capsys)
        assert code == 2 and f"{target} is a symbolic link to" in err and "remove it" in err, err
        assert snapshot(mine) == before and os.path.islink(target)
