"""Every path a command takes, checked for what it must be before any work starts, and without
leaving anything behind (no folder is created to find out whether one could be).

Writability is tried, not asked: a temporary file is created in the folder that will receive the
output, then removed (`_try_writing`). `os.access` answers yes to root for a read-only filesystem
(/proc, /sys, a read-only mount), where the run would fail only when it writes, after its work.

`output_file`: a file this run will write (`--trace`, `--json`); `output_dir`: a folder it will
fill (`--out`, `--checkpoint-dir`); `input_file`: a file it reads (`jaxdp diff A B`), a regular file (a device,
FIFO or socket would be read without end: `regular.py`). Each raises ConfigError in one line naming the flag, the
path and the fix.
"""
from __future__ import annotations

import os
import tempfile

from ..errors import ConfigError
from . import regular

PROBE = ".jaxdp-write-check-"


def _nearest_existing(path: str) -> str:
    """The path itself or its closest existing ancestor."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _try_writing(folder: str, path: str, flag: str) -> None:
    """Create and remove a temporary file in `folder`, or one line naming why it cannot be written."""
    try:
        fd, probe = tempfile.mkstemp(prefix=PROBE, dir=folder)
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot write in folder {folder} ({e.strerror or e}); choose a writable "
                          f"path") from None
    os.close(fd)
    os.unlink(probe)


def _creatable(path: str, flag: str, shown: str | None = None) -> None:
    """`path` does not exist yet: its closest existing ancestor must be a writable folder (`shown`: the
    path as the user typed it, for the message)."""
    base, shown = _nearest_existing(os.path.dirname(os.path.abspath(path))), shown or path
    if not os.path.isdir(base):
        raise ConfigError(f"{flag} {shown}: {base} is a file, not a folder; choose a path under a folder")
    _try_writing(base, shown, flag)


def output_file(path, flag: str) -> None:
    """A file to be written at the end of the run: not a folder, and writable where it will go (`--json -`:
    stdout, `atomic.STDOUT`)."""
    path = os.fspath(path)
    if path == "-" and flag == "--json":
        return
    if not path.strip():
        raise ConfigError(f"{flag} is empty; give a file path, e.g. {flag} runs/run.npz")
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path}: is a folder; give a file path, e.g. {flag} {os.path.join(path, 'run.npz')}")
    if os.path.exists(path):
        if not os.path.isfile(path):  # a device or pipe (/dev/full): the atomic rename would replace it
            raise ConfigError(f"{flag} {path}: not a regular file (a device or pipe); give a file path")
        if not os.access(path, os.W_OK):
            raise ConfigError(f"{flag} {path}: the file is not writable; choose another path")
        _try_writing(os.path.dirname(os.path.abspath(path)), path, flag)  # replaced by a rename in its folder
        return
    _creatable(path, flag)


def output_dir(path, flag: str) -> None:
    """A folder to be created or filled: not a file, and writable."""
    path = os.fspath(path)
    if not path.strip():
        raise ConfigError(f"{flag} is empty; give a folder, e.g. {flag} reports/run")
    if os.path.exists(path) and not os.path.isdir(path):
        other = regular.what(path) or "a file"  # a device or pipe named in words
        raise ConfigError(f"{flag} {path}: is {other}, not a folder; give a folder path")
    if os.path.isdir(path):
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{flag} {path}: the folder is not writable; choose another")
        _try_writing(path, path, flag)
        return
    _creatable(os.path.join(path, "x"), flag, path)


def input_file(path, flag: str) -> None:
    """A file to be read: it exists and is a regular file (a device, FIFO or socket would be read forever or
    block: `regular.py`), nothing opened to find out."""
    path = os.fspath(path)
    if not path.strip():
        raise ConfigError(f"{flag} is empty; give a file path")
    if not os.path.exists(path):
        raise ConfigError(f"{flag} {path}: no such file")
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path}: is a folder, not a file")
    other = regular.what(path)
    if other is not None:
        raise ConfigError(f"{flag} {path}: is {other}, not a regular file; give a file (a device or pipe would "
                          f"be read without end)")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{flag} {path}: the file is not readable")
