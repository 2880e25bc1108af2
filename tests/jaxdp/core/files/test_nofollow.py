"""Nothing outside the checkpoint folder is created, truncated, written or deleted (issue 67, item 2): a link
(or a FIFO) anywhere in `--checkpoint-dir` is refused in one ConfigError naming it (exit 2) before anything is
read or written, or, where a run meets one after that check, unlinked and never followed. Checked here on a
hand-made folder (a marker and two steps of small files with their manifests), the rules being the same
for both frameworks (ckpt_folder.py, manifest.py); tests/jaxdp/test_checkpoint_links.py runs both CLIs.
Every case keeps a file outside the folder and asserts its bytes and its folder's names are unchanged."""
from __future__ import annotations

import os

import pytest

from jaxdp.core.errors import ConfigError
from jaxdp.core.files import atomic, ckpt_folder, manifest, nofollow
from jaxdp.core.files.record import DamagedCheckpoint

# (the entry replaced by a link, relative to the folder; what the link points to: a file or a folder)
PLACES = [(ckpt_folder.LOCK, "file"), (ckpt_folder.MARKER, "file"), (f".{ckpt_folder.MARKER}.x1.tmp", "file"),
          ("2", "folder"), ("2/a.bin", "file"), ("2/sub", "folder"), ("2/sub/b.bin", "file"),
          (f"2/{manifest.NAME}", "file"), ("2.partial", "folder"), ("1.orbax-checkpoint-tmp-9", "folder")]


def make_folder(root) -> str:
    """A checkpoint folder as a run leaves it: marker listing steps 1 and 2, each with a manifest."""
    folder = os.path.join(root, "ck")
    for step in (1, 2):
        os.makedirs(os.path.join(folder, str(step), "sub"))
        for rel in ("a.bin", "sub/b.bin"):
            with open(os.path.join(folder, str(step), rel), "wb") as f:
                f.write(bytes([step]) * 64)
        manifest.write(os.path.join(folder, str(step)), "jax", step)
    ckpt_folder._write_marker(folder, "jax", [1, 2], "run")
    return folder


def outside(root) -> tuple[str, dict]:
    """A folder of someone's files beside the checkpoint folder, and a snapshot of it."""
    mine = os.path.join(root, "mine")
    os.makedirs(mine, exist_ok=True)
    for name in ("data.bin", "notes.txt"):
        with open(os.path.join(mine, name), "w") as f:
            f.write(f"{name}: keep me\n")
    return mine, snapshot(mine)


def snapshot(folder) -> dict:
    out = {}
    for here, _, names in os.walk(folder):
        for n in names:
            with open(os.path.join(here, n), "rb") as f:
                out[os.path.relpath(os.path.join(here, n), folder)] = f.read()
    return out


def plant(folder, rel, kind, mine) -> str:
    """Replace `folder/rel` with a link to someone's file or folder (what a run must never follow)."""
    path = os.path.join(folder, rel)
    nofollow.remove(path)
    os.symlink(os.path.join(mine, "data.bin") if kind == "file" else mine, path)
    if rel.endswith((".partial", ".orbax-checkpoint-tmp-9")):  # a torn save of a listed step: ours by name
        assert ckpt_folder._ours(rel, {1, 2})
    return path


@pytest.mark.parametrize("resume,overwrite", [(True, False), (False, True)])
@pytest.mark.parametrize("rel,kind", PLACES)
def test_a_link_anywhere_in_the_folder_is_refused_and_never_followed(tmp_path, rel, kind, resume, overwrite):
    folder = make_folder(str(tmp_path))
    mine, before = outside(str(tmp_path))
    path = plant(folder, rel, kind, mine)
    for framework in ("jax", "torch"):  # (a jax folder: torch refuses it too, here before the framework)
        with pytest.raises(ConfigError, match=f"{path} is a symbolic link to .*never follows a link") as e:
            ckpt_folder.precheck(folder, framework, resume=resume, overwrite=overwrite)
        assert "\n" not in str(e.value)
        with pytest.raises(ConfigError, match=f"{path} is a symbolic link"):
            ckpt_folder.claim(folder, framework, resume=resume, overwrite=overwrite)
    assert snapshot(mine) == before and os.path.islink(path)


def test_a_fifo_is_refused_and_never_opened(tmp_path):
    """A reader opening a FIFO waits for a writer for ever: the marker, the lock or a step's file."""
    for rel in (ckpt_folder.MARKER, ckpt_folder.LOCK, "2/a.bin"):
        folder = make_folder(str(tmp_path / rel.replace("/", "_")))
        nofollow.remove(os.path.join(folder, rel))
        os.mkfifo(os.path.join(folder, rel))
        with pytest.raises(ConfigError, match="is a FIFO"):
            ckpt_folder.precheck(folder, "jax", resume=True, overwrite=False)
        with pytest.raises(ConfigError, match="is a FIFO"):
            ckpt_folder.claim(folder, "jax", resume=True, overwrite=False)


def test_a_hard_linked_lock_or_a_folder_for_a_lock_is_refused_unwritten(tmp_path):
    folder = make_folder(str(tmp_path))
    mine, before = outside(str(tmp_path))
    os.link(os.path.join(mine, "data.bin"), os.path.join(folder, ckpt_folder.LOCK))
    with pytest.raises(ConfigError, match="a file with 2 names"):
        ckpt_folder.claim(folder, "jax", resume=True, overwrite=False)
    assert snapshot(mine) == before
    os.remove(os.path.join(folder, ckpt_folder.LOCK))
    os.mkdir(os.path.join(folder, ckpt_folder.LOCK))
    with pytest.raises(ConfigError, match=r"\.jaxdp-lock is a folder"):
        ckpt_folder.precheck(folder, "jax", resume=True, overwrite=False)


def test_links_met_after_the_check_are_unlinked_not_followed(tmp_path):
    """A link that appears after `check` (another process): prune, discard_torn and `remove` delete the link,
    the manifest refuses to vouch for it, the resume's verification names it, and the marker is not read."""
    folder = make_folder(str(tmp_path))
    mine, before = outside(str(tmp_path))
    plant(folder, "2.partial", "folder", mine)
    ckpt_folder.discard_torn(folder)
    assert not os.path.lexists(os.path.join(folder, "2.partial"))
    plant(folder, "1", "folder", mine)
    assert ckpt_folder.steps(folder) == [2]  # a link is never a checkpoint
    nofollow.remove(os.path.join(folder, "1"))
    for rel, kind in (("2/sub", "folder"), ("2/a.bin", "file"), ("2", "folder")):
        path = plant(folder, rel, kind, mine)
        with pytest.raises(DamagedCheckpoint, match="symbolic link.*no manifest is written"):
            manifest.write(os.path.join(folder, "2"), "jax", 2)
        with pytest.raises(DamagedCheckpoint, match=f"step 2 .* is damaged: ({rel[2:]}|its folder) is a symbolic link"):
            manifest.verify(folder, [2], 2)
        nofollow.remove(path)
    plant(folder, ckpt_folder.MARKER, "file", mine)
    with pytest.raises(DamagedCheckpoint, match="is damaged"):
        ckpt_folder.read_marker(folder)
    assert snapshot(mine) == before


def test_a_manifest_naming_a_file_outside_the_step_never_opens_it(tmp_path):
    folder = make_folder(str(tmp_path))
    step = os.path.join(folder, "2")
    with open(os.path.join(step, manifest.NAME)) as f:
        text = f.read().replace('"sub/b.bin"', '"../../mine/data.bin"')
    with open(os.path.join(step, manifest.NAME), "w") as f:
        f.write(text)
    outside(str(tmp_path))
    assert manifest.problem(step) == "sub/b.bin is not in its manifest (added after the save)"
    os.remove(os.path.join(step, "sub", "b.bin"))
    assert manifest.problem(step) == "../../mine/data.bin is missing"


def test_the_named_folder_may_be_a_link_but_not_a_dangling_one(tmp_path):
    """The user named `--checkpoint-dir`: a link to a folder is followed; a link to nothing is refused."""
    folder = make_folder(str(tmp_path))
    os.symlink(folder, tmp_path / "via")
    ckpt_folder.claim(str(tmp_path / "via"), "jax", resume=True, overwrite=False).release()
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    with pytest.raises(ConfigError, match="dangling is a symbolic link to .*nowhere.*not a folder"):
        ckpt_folder.claim(str(tmp_path / "dangling"), "jax", resume=False, overwrite=False)
    assert not (tmp_path / "nowhere").exists()


def test_an_output_path_that_is_a_link_is_replaced_not_written_through(tmp_path):
    """`--trace`, `--out`, the marker, the manifest: every atomic write renames a new file onto the path."""
    mine, before = outside(str(tmp_path))
    out = tmp_path / "trace.npz"
    os.symlink(os.path.join(mine, "data.bin"), out)
    atomic.write_bytes(out, b"new")
    assert not out.is_symlink() and out.read_bytes() == b"new" and snapshot(mine) == before
