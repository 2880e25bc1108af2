"""The manifest's MAC under the user's key (`JAXDP_CHECKPOINT_KEY`, manifest_key.py), both ways: with the key
set, a file changed and the manifest recomputed without the key, or under another key, or a step copied
under another number, is damaged; without the key, the same step passes (a checksum proves integrity only,
docs/RELIABILITY.md). On a hand-made folder; both frameworks' saves and resumes: tests/jaxdp/test_checkpoint_key.py."""
from __future__ import annotations

import os
import shutil

from jaxdp.core.files import manifest, manifest_key
from tests.jaxdp.core.files.test_nofollow import make_folder


def rewrite(step_dir, key: str | None, monkeypatch) -> None:
    """Change a file of `step_dir` and write its manifest again, under `key` (None: without one)."""
    with open(os.path.join(step_dir, "a.bin"), "r+b") as f:
        f.write(b"\xff")
    with monkeypatch.context() as m:
        if key is None:
            m.delenv(manifest_key.ENV, raising=False)
        else:
            m.setenv(manifest_key.ENV, key)
        manifest.write(step_dir, "jax", int(os.path.basename(step_dir)))


def test_with_the_key_a_rewritten_manifest_is_refused_and_without_it_passes(tmp_path, monkeypatch):
    monkeypatch.setenv(manifest_key.ENV, "k1")
    folder = make_folder(str(tmp_path))  # saved under k1
    step = os.path.join(folder, "2")
    assert manifest.problem(step) is None
    rewrite(step, None, monkeypatch)
    assert "carries no MAC" in manifest.problem(step)
    rewrite(step, "k2", monkeypatch)
    assert "MAC does not match" in manifest.problem(step)
    monkeypatch.delenv(manifest_key.ENV)
    assert manifest.problem(step) is None  # no key: integrity only, the rewrite passes
    rewrite(step, "k1", monkeypatch)  # whoever holds the key can vouch
    monkeypatch.setenv(manifest_key.ENV, "k1")
    assert manifest.problem(step) is None


def test_a_signed_step_copied_under_another_number_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(manifest_key.ENV, "k1")
    folder = make_folder(str(tmp_path))
    shutil.rmtree(os.path.join(folder, "2"))
    shutil.copytree(os.path.join(folder, "1"), os.path.join(folder, "2"))
    assert "written for step 1" in manifest.problem(os.path.join(folder, "2"))
    assert manifest.problem(os.path.join(folder, "1")) is None


def test_the_mac_covers_every_field_and_no_key_signs_nothing(monkeypatch):
    monkeypatch.delenv(manifest_key.ENV, raising=False)
    body = {"format": 1, "step": 2, "framework": "jax", "files": {"a": {"size": 1, "sha256": "0" * 64}}}
    assert manifest_key.sign(body) == body and manifest_key.problem(body, "2") is None
    monkeypatch.setenv(manifest_key.ENV, "k1")
    signed = manifest_key.sign(body)
    assert manifest_key.problem(signed, "2") is None
    for field, value in (("framework", "torch"), ("files", {}), ("format", 2)):
        assert "does not match" in manifest_key.problem({**signed, field: value}, "2")
