"""ckpt_folder.Lock on a full disk: the pid written into the lock has no room, and the one line names the lock
(the OSError of a `pwrite` carries no file name: the CLI printed `error: No space left on device`)."""
from __future__ import annotations

import errno
import os

import pytest

from jaxdp.core import ckpt_folder, errors


def test_a_lock_without_room_for_its_pid_is_named_in_the_one_line(tmp_path, monkeypatch):
    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ckpt_folder.os, "pwrite", full)
    with pytest.raises(OSError) as caught:
        ckpt_folder.Lock(str(tmp_path))
    lock = os.path.join(str(tmp_path), ckpt_folder.LOCK)
    assert errors.one_line(caught.value) == f"{lock}: No space left on device"
    assert errors.exit_status(caught.value) == 3
    monkeypatch.undo()
    ckpt_folder.Lock(str(tmp_path)).release()  # the descriptor was closed: the flock is free again
