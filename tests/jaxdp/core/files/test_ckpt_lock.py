"""ckpt_folder.Lock on a full disk: the pid written into the lock has no room, and the one line names the lock
(the OSError of a `pwrite` carries no file name: the CLI printed `error: No space left on device`)."""
from __future__ import annotations

import errno
import os

import pytest

from jaxdp.core import errors
from jaxdp.core.files import ckpt_folder


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


def test_the_processes_of_one_run_probing_at_once_never_refuse_each_other(tmp_path, monkeypatch):
    """Each process of `train --processes 2` prechecks the folder as it starts; a probe took the run's exclusive
    lock (and wrote its pid), so two at once refused one another ('in use by another run (process ?...)': seen once
    in a fresh suite run, a resume after SIGTERM). Probes share; a run's claim waits out a probe's moment."""
    folder = str(tmp_path)
    old_pid = os.path.join(folder, ckpt_folder.LOCK)
    with open(old_pid, "w") as f:
        f.write("999999")  # a dead run's pid, left in the file
    probe = ckpt_folder.Lock(folder, probe=True)
    ckpt_folder.Lock(folder, probe=True).release()  # a second probe at once
    monkeypatch.setattr(ckpt_folder, "PROBE_S", 0.3)
    with pytest.raises(errors.ConfigError, match="in use by another run"):
        ckpt_folder.Lock(folder)  # held (shared) past the wait: refused
    probe.release()
    run = ckpt_folder.Lock(folder)
    assert open(old_pid).read() == str(os.getpid())  # the run's pid, written by the run alone
    with pytest.raises(errors.ConfigError, match=f"process {os.getpid()} holds"):
        ckpt_folder.Lock(folder, probe=True)  # a probe meets the run: refused, naming it
    run.release()
