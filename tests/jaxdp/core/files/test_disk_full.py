"""A full disk anywhere is exit 3 and one line naming the path and the cause (jaxdp/core/files/disk_full.py, issue 67
item 5), in both frameworks, with every earlier checkpoint intact. Always checked by injecting the error where
each library raises it (orbax's tensorstore ValueError, in `save` and in its writer threads; DCP's
CheckpointException; an OSError without a file name from a write); and on a real 1 MiB tmpfs where this
process may mount one (root), else skipped naming why."""
from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import traceback
import types

import numpy as np
import pytest
from torch.distributed.checkpoint.api import CheckpointException

from jaxdp.core.files import atomic, ckpt_folder, disk_full, manifest
from jaxdp.core.process import last_words, xla_flags
from jaxdp.harness import cli, torch_cli

FULL = os.strerror(errno.ENOSPC)  # 'No space left on device'
TENSORSTORE = ('RESOURCE_EXHAUSTED: Failed writing: "{path}": Failed to write 2138 bytes to file 7: No space left '
               "on device [os_error_code='28']")
FLAGS = ["--strategy", "single", "--hidden", "4,4", "--batch-size", "8"]


def enospc(path=None) -> OSError:
    return OSError(errno.ENOSPC, FULL, path) if path else OSError(errno.ENOSPC, FULL)


def dcp_failure(error) -> CheckpointException:
    return CheckpointException("CheckpointException ranks:dict_keys([0])", {0: (error, traceback.StackSummary())})


@pytest.mark.parametrize("shape", ["oserror", "chained", "tensorstore", "dcp", "group", "quota", "file size"])
def test_find_sees_a_full_disk_in_every_shape_a_library_raises(shape):
    inner = enospc("/d/x")
    try:
        raise RuntimeError("save failed") from inner
    except RuntimeError as e:
        chained = e
    error = {"oserror": inner, "chained": chained, "tensorstore": ValueError(TENSORSTORE.format(path="/d/x")),
             "dcp": dcp_failure(inner), "group": ExceptionGroup("writers", [ValueError("no"), inner]),
             "quota": OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/d/x"),
             "file size": OSError(errno.EFBIG, os.strerror(errno.EFBIG), "/d/x")}[shape]
    full = disk_full.find(error)
    assert full is not None and full.filename == "/d/x", full
    assert disk_full.line(full) == f"/d/x: {full.strerror}"


def test_find_leaves_other_errors_alone():
    for error in (ValueError("RESOURCE_EXHAUSTED: out of memory"), OSError(errno.EACCES, "denied", "/x"),
                  KeyboardInterrupt(), dcp_failure(ValueError("bad"))):
        assert disk_full.find(error) is None, error


def test_an_unnamed_write_error_is_named_by_the_file_it_was_writing(tmp_path, monkeypatch):
    path, out = tmp_path / "a.json", tmp_path / "report"
    with pytest.raises(OSError) as caught:
        with atomic.writing(path, "w"):
            raise enospc()  # a write's or a close's: no file name
    assert caught.value.filename == str(path) and not path.exists() and os.listdir(tmp_path) == []
    with pytest.raises(OSError) as caught, atomic.staged(out) as stage:
        (open(os.path.join(stage, "a.md"), "w")).close()
        raise enospc()
    assert caught.value.filename == str(out) and not out.exists()


def test_after_a_full_disk_the_closed_event_loop_s_echoes_are_dropped_and_nothing_else(monkeypatch):
    """tensorstore's threads call into orbax's event loop after the failed save closed it: Python prints each as an
    unraisable RuntimeError with its traceback (seen: 18-114 lines around the one line). Dropped; others are not."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    with pytest.raises(disk_full.DiskFull):
        with disk_full.answered("checkpoint step 3 not saved"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/x/3/d")

    def unraisable(error):  # what Python hands the hook (sys.UnraisableHookArgs' fields)
        return types.SimpleNamespace(exc_type=type(error), exc_value=error, exc_traceback=None, err_msg=None,
                                     object=None)

    sys.unraisablehook(unraisable(RuntimeError(disk_full.CLOSED_LOOP)))
    assert seen == []
    other = unraisable(RuntimeError("something else"))
    sys.unraisablehook(other)
    assert seen == [other]
    full = ValueError("RESOURCE_EXHAUSTED: Failed writing: \"/x/3/d\": No space left on device [os_error_code='28']")
    for error, kept in ((full, False), (ValueError("another"), True)):
        record = logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "_GatheringFuture exception was never "
                                   "retrieved", None, (type(error), error, None))
        assert logging.getLogger("asyncio").filter(record) is kept


def test_last_words_go_to_the_launcher_or_nowhere(tmp_path, monkeypatch):
    monkeypatch.delenv(last_words.ENV, raising=False)
    assert not last_words.leave("x", 3)  # not a launched process: the caller prints
    monkeypatch.setenv(last_words.ENV, str(tmp_path / "w"))
    assert last_words.leave("jaxdp: error: process 1: x", 3, "")
    assert last_words.read(tmp_path / "w") == {"line": "jaxdp: error: process 1: x", "status": 3, "traceback": ""}
    assert last_words.read(tmp_path / "none") is None


def test_a_failed_write_on_a_disk_without_room_is_a_full_disk(tmp_path, monkeypatch):
    """torch's zip writer loses the errno ('unexpected pos 704 vs 598'): a failure in a save while the disk has
    no room left is the full disk; the same failure with room left is not."""
    real = os.statvfs
    room = {"blocks": 0}

    def statvfs(path):
        st = real(path)
        return os.statvfs_result((st.f_bsize, st.f_frsize, st.f_blocks, room["blocks"], room["blocks"], *st[5:]))

    monkeypatch.setattr(disk_full.os, "statvfs", statvfs)
    hidden = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    with pytest.raises(disk_full.DiskFull, match=f"step 2 not saved: {tmp_path}/2.partial: {FULL}"):
        with disk_full.answered("step 2 not saved", tmp_path / "2.partial"):
            raise hidden
    room["blocks"] = 1 << 20
    with pytest.raises(RuntimeError, match="unexpected pos"):
        with disk_full.answered("step 2 not saved", tmp_path / "2.partial"):
            raise hidden
    room["blocks"] = 0
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C is never a full disk
        with disk_full.answered("step 2 not saved", tmp_path / "2.partial"):
            raise KeyboardInterrupt


def one_line(main, argv, capfd) -> tuple[int, str]:
    code = main(argv)
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    return code, "\n".join(err)


def kept_intact(folder, steps, torn_gone: bool = True) -> None:
    assert ckpt_folder.steps(folder) == steps
    for s in steps:
        assert manifest.problem(os.path.join(folder, str(s))) is None
    assert not torn_gone or not [n for n in os.listdir(folder) if ".partial" in n or "tmp" in n], os.listdir(folder)


def _orbax_failing(monkeypatch, where: str, tmp_path):
    """orbax's manager failing at step 2: in `save`, in its writer threads (`wait_until_finished`), or the
    manifest's write after it (an OSError with no file name)."""
    import orbax.checkpoint as ocp

    save, wait = ocp.CheckpointManager.save, ocp.CheckpointManager.wait_until_finished
    torn = tmp_path / "ck" / "2.orbax-checkpoint-tmp"

    def failing_save(self, step, *a, **k):
        if step == 2 and where == "save":
            torn.mkdir()
            raise ValueError(TENSORSTORE.format(path=torn / "state" / "d" / "0"))
        self._step = step
        return save(self, step, *a, **k)

    def failing_wait(self):
        wait(self)
        if getattr(self, "_step", 0) == 2 and where == "thread":
            raise ValueError(TENSORSTORE.format(path=tmp_path / "ck" / "2" / "x"))

    monkeypatch.setattr(ocp.CheckpointManager, "save", failing_save)
    monkeypatch.setattr(ocp.CheckpointManager, "wait_until_finished", failing_wait)
    if where == "manifest":
        write = manifest.write
        monkeypatch.setattr(manifest, "write", lambda d, f, s: write(d, f, s) if s != 2 else (_ for _ in ()).throw(
            enospc()))


@pytest.mark.parametrize("where", ["save", "thread", "manifest"])
def test_jaxdp_a_full_disk_in_a_checkpoint_save_is_one_line_and_status_3(tmp_path, monkeypatch, capfd, where):
    _orbax_failing(monkeypatch, where, tmp_path)
    folder = str(tmp_path / "ck")
    code, err = one_line(cli.main, ["train", *FLAGS, "--steps", "3", "--checkpoint-dir", folder,
                                    "--checkpoint-every", "1"], capfd)
    assert code == 3 and len(err.splitlines()) == 1, err
    assert err.startswith("jaxdp: error: checkpoint step 2 not saved: ") and f": {FULL}; kept" in err, err
    assert folder in err
    kept_intact(folder, [1])


def test_torch_ref_a_full_disk_in_a_checkpoint_save_is_one_line_and_status_3(tmp_path, monkeypatch, capfd):
    from torch_ref import checkpoint

    save = checkpoint.dcp.save

    def failing(state, checkpoint_id, **k):
        if str(checkpoint_id).endswith("2.partial"):
            os.makedirs(checkpoint_id, exist_ok=True)
            raise dcp_failure(enospc())  # as DCP raises it: the rank's OSError inside, no file name
        return save(state, checkpoint_id=checkpoint_id, **k)

    monkeypatch.setattr(checkpoint.dcp, "save", failing)
    folder = str(tmp_path / "ck")
    code, err = one_line(torch_cli.main, ["train", *FLAGS, "--steps", "3", "--checkpoint-dir", folder,
                                          "--checkpoint-every", "1"], capfd)
    assert code == 3 and len(err.splitlines()) == 1, err
    assert err == f"torch_ref: error: checkpoint step 2 not saved: {folder}/2.partial: {FULL}; kept checkpoint " \
                  f"step 1: free space, then --resume", err
    kept_intact(folder, [1])


@pytest.mark.parametrize("main, prog", [(cli.main, "jaxdp"), (torch_cli.main, "torch_ref")])
def test_a_full_disk_writing_the_trace_is_one_line(tmp_path, monkeypatch, capfd, main, prog):
    def full(*a, **k):
        raise enospc()

    monkeypatch.setattr(np, "savez", full)
    path = str(tmp_path / "t.npz")
    code, err = one_line(main, ["train", *FLAGS, "--steps", "2", "--trace", path], capfd)
    assert code == 3 and err == f"{prog}: error: {path}: {FULL}" and os.listdir(tmp_path) == [], err


def test_a_full_disk_writing_diffs_json_is_one_line(tmp_path, monkeypatch, capfd):
    from jaxdp.core.traces import trace

    a = str(tmp_path / "a.npz")
    trace.save(a, {"steps": 0, "first_step": 1}, {})
    real = json.dump

    def full(obj, f, **k):
        real(obj, f, **k)
        raise enospc()

    monkeypatch.setattr(json, "dump", full)
    out = str(tmp_path / "d.json")
    code, err = one_line(cli.main, ["diff", a, a, "--json", out], capfd)
    assert code == 3 and err.splitlines()[-1] == f"jaxdp: error: {out}: {FULL}" and not os.path.exists(out), err


# ---- a real small filesystem ---------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs, filled but for about 430 KiB (room for a checkpoint or two of the default mlp); skipped
    where this process may not mount one."""
    if os.geteuid() != 0:
        pytest.skip("a real small filesystem needs mount (root); the injected tests above check the same lines")
    where = tmp_path / "small"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True,
                          text=True)
    if done.returncode:
        pytest.skip(f"mount -t tmpfs not permitted here: {done.stderr.strip()}")
    try:
        (where / "filler").write_bytes(b"\0" * 600_000)
        yield str(where)
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.parametrize("main, prog", [(cli.main, "jaxdp"), (torch_cli.main, "torch_ref")])
def test_on_a_full_tmpfs_the_save_and_the_resume_are_one_line(small_disk, capfd, main, prog):
    folder = os.path.join(small_disk, "ck")
    argv = ["train", "--strategy", "single", "--steps", "12", "--checkpoint-dir", folder, "--checkpoint-every", "1"]
    for again in (False, True):
        code, err = one_line(main, argv + ["--resume"] * again, capfd)
        assert code == 3 and len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert err.startswith(f"{prog}: error: checkpoint step ") and f"{folder}/" in err and FULL in err, err
        kept = ckpt_folder.steps(folder)
        assert kept and f"kept checkpoint step{'s' * (len(kept) > 1)} {', '.join(map(str, kept))}" in err, err
        kept_intact(folder, kept)


@pytest.mark.slow
def test_on_a_full_tmpfs_the_launcher_prints_one_line(small_disk):
    """`jaxdp train --processes 2`: each process writes its shards; the launcher prints the first cause's line,
    not each process's traceback nor a peer's abort when the coordinator goes."""
    folder = os.path.join(small_disk, "ck")
    argv = [sys.executable, "-m", "jaxdp", "train", "--strategy", "ddp", "--devices", "2", "--processes", "2",
            "--steps", "12", "--timeout", "240", "--checkpoint-dir", folder, "--checkpoint-every", "1"]
    for again in (False, True):  # the save, then the resume on the same disk
        out = subprocess.run(argv + ["--resume"] * again, capture_output=True, text=True, timeout=300,
                             env=xla_flags.for_child(os.environ))
        errors = [line for line in out.stderr.splitlines() if not line.startswith("jaxdp: started process")]
        assert out.returncode == 3 and len(errors) == 1, out.stderr[-3000:]
        assert "checkpoint step" in errors[0] and FULL in errors[0] and f"{folder}/" in errors[0], errors
        kept_intact(folder, ckpt_folder.steps(folder), torn_gone=False)  # process 1's torn save goes at the next claim


@pytest.mark.slow
# where the 1 MiB disk fills depends on the ranks' timing: under load a rank's zip writer can lose the errno and
# DCP's cleanup free room before the check (seen once in a loaded CI run; passes alone): rerun, never skipped
@pytest.mark.flaky(reruns=2, only_rerun=["AssertionError"])
def test_on_a_full_tmpfs_torch_ranks_answer_in_one_line(small_disk, capfd):
    """`python -m torch_ref train --devices 2`: rank 1's write fails inside torch's zip writer, without an errno;
    the disk without room names it. The save, then the resume on the same disk."""
    folder = os.path.join(small_disk, "ck")
    argv = ["train", "--strategy", "ddp", "--devices", "2", "--steps", "12", "--checkpoint-dir", folder,
            "--checkpoint-every", "1"]
    for again in (False, True):
        code, err = one_line(torch_cli.main, argv + ["--resume"] * again, capfd)
        assert code == 3 and len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert err.startswith("torch_ref: error: rank ") and f"{folder}/" in err and FULL in err, err
        kept_intact(folder, ckpt_folder.steps(folder))
