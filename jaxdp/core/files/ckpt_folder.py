"""The run owns its `--checkpoint-dir`, in both frameworks: a marker says which entries jaxdp or torch_ref
wrote there, a lock keeps a second run out, and nothing else in the folder is ever deleted or overwritten.

    DIR/jaxdp-checkpoints.json   the marker: {"written_by": "jaxdp", "framework", "run_id", "steps"}; a
                                 step is added before its save starts, so a save cut short is ours too
    DIR/.jaxdp-lock              flock'ed by the run (process or rank 0 only) for its whole life
    DIR/<step>/                  a checkpoint: ours when the marker lists it (and intact: its manifest)

- `check(...)`: before any work (the CLIs call `precheck`, which adds the lock, before a process
  starts). Refused with exit 2 naming the entry and the fix: an entry the marker does not list (a user's
  `7/`, notes), another framework's checkpoints, and a fresh run on a folder holding checkpoints unless
  `--resume` or `--overwrite-checkpoints` says what to do with them.
- `claim(...)`: `check`, the lock (a second run: refused), then `--overwrite-checkpoints` deletes only
  the marker's steps; returns the `Lock` to release when the run ends.
- `begin_step`, `prune`, `discard_torn`: touch only what the marker lists.

No link in the folder is ever followed (nofollow.py): `check` refuses a link, a FIFO or a device anywhere
in it, the lock is opened O_NOFOLLOW, and deleting unlinks a link instead of what it points to.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
import uuid

from ..errors import ConfigError
from . import nofollow
from .atomic import write_json
from .record import TORN, DamagedCheckpoint

MARKER = "jaxdp-checkpoints.json"
MANIFEST = "jaxdp-manifest.json"  # manifest.NAME: a step is whole when it has one
LOCK = ".jaxdp-lock"
OVERWRITE = "--overwrite-checkpoints"
PROGRAM = {"jax": "jaxdp", "torch": "torch_ref"}
PROBE_S = 2.0  # how long a flock is tried before the folder is called in use (a probe holds it for microseconds)


def read_marker(directory) -> dict | None:
    path = os.path.join(directory, MARKER)
    if not os.path.lexists(path):
        return None
    try:
        with nofollow.open_plain(path, "r") as f:  # a link or a FIFO: damaged, never followed
            marker = json.load(f)
        marker["steps"] = sorted({int(s) for s in marker["steps"]})
        assert marker.get("written_by") == "jaxdp" and marker.get("framework") in PROGRAM
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as e:
        raise DamagedCheckpoint(f"--checkpoint-dir {directory}: its {MARKER} is damaged ({type(e).__name__}); "
                                f"move the folder aside and start with an empty --checkpoint-dir") from None
    return marker


def _ours(name: str, steps) -> bool:
    """Is `name` one of the marker's steps, a save of one cut short, the marker, its temporary or the lock?"""
    if name in (MARKER, LOCK) or name.startswith(f".{MARKER}."):
        return True
    head, dot, _ = name.partition(".")
    return head.isdigit() and int(head) in steps and (not dot or any(m in name for m in TORN))


def steps(directory) -> list[int]:
    """The checkpoints (complete folders) the marker of `directory` lists."""
    marker = read_marker(directory) if os.path.isdir(directory) else None
    return [s for s in (marker or {}).get("steps", []) if nofollow.is_folder(os.path.join(directory, str(s)))]


def _foreign(directory, marker) -> list[str]:
    owned = set(marker["steps"]) if marker else set()
    return sorted(n for n in os.listdir(directory) if not _ours(n, owned))


def check(directory, framework: str, *, resume: bool, overwrite: bool) -> None:
    """Refuse (ConfigError, exit 2) a `--checkpoint-dir` this run may not use; read-only. A link anywhere in
    it (or a FIFO, a device) is refused: its entries first, before the marker is read; below them (the
    steps' files) once all are known to be ours (a user's big folder is not walked)."""
    if not os.path.isdir(directory):
        if os.path.islink(directory):
            raise ConfigError(f"--checkpoint-dir {directory} is a symbolic link to {os.readlink(directory)!r}, "
                              f"which is not a folder: give a folder, or a link to one")
        return
    names = os.listdir(directory)
    nofollow.refuse(directory, names)
    marker = read_marker(directory)
    foreign = _foreign(directory, marker)
    if foreign:
        names = ", ".join(repr(n) for n in foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ConfigError(f"--checkpoint-dir {directory} holds {names}, which no jaxdp or torch_ref run wrote there "
                          f"(not listed in its {MARKER}); a run never deletes or overwrites what it did not write: "
                          f"move them, or give an empty or new --checkpoint-dir")
    nofollow.refuse(directory, names, deep=True)
    have = steps(directory)
    if marker and marker["framework"] != framework and (resume or (have and not overwrite)):
        raise ConfigError(f"--checkpoint-dir {directory} holds {PROGRAM[marker['framework']]} checkpoints, which "
                          f"{PROGRAM[framework]} cannot resume: give another --checkpoint-dir, or {OVERWRITE} to "
                          f"delete them and start over")
    if have and not resume and not overwrite:
        raise ConfigError(f"--checkpoint-dir {directory} holds checkpoints of an earlier run (steps "
                          f"{', '.join(map(str, have))}): pass --resume to continue from step {have[-1]}, or "
                          f"{OVERWRITE} to delete them and start over")


def precheck(directory, framework: str, *, resume: bool, overwrite: bool) -> None:
    """`check`, and a run holding the folder refused, without taking it (the CLIs, before a process starts)."""
    if os.path.lexists(os.path.join(directory, MARKER)):
        Lock(directory, probe=True).release()
    check(directory, framework, resume=resume, overwrite=overwrite)


class Lock:
    """An exclusive flock on DIR/.jaxdp-lock, held until `release` (or this process ends). The run writes its
    pid into the lock: a link, a FIFO or a file with another name (a hard link) is refused, never written.
    `probe`: a shared flock, taken and released by `precheck` to ask whether a run holds the folder: probes (the
    processes of one run, each checking at its start) never refuse each other, and write nothing. A run's
    exclusive flock that meets a probe tries again for up to PROBE_S; so does a probe, before it says "in use"."""

    def __init__(self, directory, probe: bool = False):
        self.path = os.path.join(directory, LOCK)
        self.fd = _open_lock(self.path, directory)
        deadline = time.monotonic() + PROBE_S
        while True:
            try:
                fcntl.flock(self.fd, (fcntl.LOCK_SH if probe else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() < deadline:  # a probe's moment (its file may still show a dead run's pid)
                    time.sleep(0.02)
                    continue
                holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip()
                os.close(self.fd)
                raise ConfigError(f"--checkpoint-dir {directory} is in use by another run (process {holder or '?'} "
                                  f"holds {self.path}); wait for it to end, or give another --checkpoint-dir") from None
        if probe:
            return
        try:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        except OSError as e:  # a full disk: the pid has no room; the error names no file, so name the lock
            os.close(self.fd)
            raise OSError(e.errno, e.strerror, self.path) from None

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)  # closing the descriptor ends the flock
            self.fd = None


def _open_lock(path, directory) -> int:
    """A descriptor on the lock file `path`, created when absent; ConfigError when it is anything but a
    regular file with one name (O_NOFOLLOW: a link made after the check is not followed either)."""
    what = nofollow.kind(path)
    fd = None
    if what is None:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as e:  # a link made after `kind` looked (ELOOP), a folder (EISDIR)
            what = nofollow.kind(path) or ("a folder" if nofollow.is_folder(path) else None)
            if what is None and e.errno != errno.ELOOP:
                raise
            what = what or "a symbolic link"
    if fd is not None:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            return fd
        os.close(fd)
        what = (f"a file with {st.st_nlink} names (a hard link: writing into it writes into the others)"
                if stat.S_ISREG(st.st_mode) else "not a file")
    raise nofollow.refusal(directory, path, what)


def claim(directory, framework: str, *, resume: bool, overwrite: bool) -> Lock | None:
    """Take `directory` for this run (process or rank 0): checked, locked, and with `overwrite` emptied of
    the marker's checkpoints. Raises ConfigError (exit 2) when the run may not use it."""
    if resume and not os.path.isdir(directory):
        return None  # nothing to hold: the restore says there is no such folder
    if not os.path.lexists(os.path.join(directory, MARKER)):
        check(directory, framework, resume=resume, overwrite=overwrite)  # nothing written into a foreign folder
    os.makedirs(directory, exist_ok=True)
    lock = Lock(directory)  # a run holding it: "in use", before what it holds is judged
    try:
        check(directory, framework, resume=resume, overwrite=overwrite)  # again, now that no one else writes
        marker = read_marker(directory) or {"steps": []}
        if overwrite and not resume:
            for name in os.listdir(directory):
                if name not in (MARKER, LOCK) and _ours(name, set(marker["steps"])):
                    nofollow.remove(os.path.join(directory, name))  # a link: unlinked, never followed
            marker["steps"] = []
        discard_torn(directory)  # a save cut short (a full disk, a kill) is never read: its room comes back first
        _write_marker(directory, framework, marker["steps"], uuid.uuid4().hex)
    except BaseException:
        lock.release()
        raise
    return lock


def _write_marker(directory, framework: str, step_list, run_id: str) -> None:
    write_json(os.path.join(directory, MARKER), {"written_by": "jaxdp", "framework": framework, "run_id": run_id,
                                                 "steps": sorted(set(step_list))})


def begin_step(directory, framework: str, step: int) -> None:
    """List `step` in the marker before its save starts (the marker is created when absent)."""
    os.makedirs(directory, exist_ok=True)
    marker = read_marker(directory) or {"steps": [], "run_id": uuid.uuid4().hex}
    names = os.listdir(directory)
    kept = [s for s in marker["steps"] if any(n == str(s) or n.startswith(f"{s}.") for n in names)]
    _write_marker(directory, framework, [*kept, step], marker.get("run_id", ""))


def prune(directory, keep: int) -> None:
    """Delete the marker's oldest checkpoints beyond the newest `keep`; nothing else."""
    for old in steps(directory)[:-keep]:
        nofollow.remove(os.path.join(directory, str(old)))


def discard_torn(directory) -> None:
    """Remove the saves of the marker's steps that a stopped run left unfinished (never a checkpoint, and
    each framework's restore ignores them); a folder without a marker is left as it is."""
    if not directory or not os.path.isdir(directory):
        return
    owned = set((read_marker(directory) or {"steps": []})["steps"])
    for name in os.listdir(directory):
        if any(mark in name for mark in TORN) and _ours(name, owned):
            nofollow.remove(os.path.join(directory, name))


def drop_unfinished(directory, step: int) -> str:
    """After a save of `step` failed (a full disk): remove what it left (its torn folder, or its folder when the
    manifest is missing, which would make it a damaged step) and say what is kept, for the one line."""
    discard_torn(directory)
    folder = os.path.join(directory, str(step))
    if step in (read_marker(directory) or {"steps": []})["steps"] and nofollow.is_folder(folder) \
            and not os.path.lexists(os.path.join(folder, MANIFEST)):
        nofollow.remove(folder)
    kept = steps(directory)
    return (f"kept checkpoint step{'s' * (len(kept) > 1)} {', '.join(map(str, kept))}: free space, then --resume"
            if kept else "no checkpoint kept: free space and start again")
