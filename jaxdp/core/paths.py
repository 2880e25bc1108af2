"""Every path a command takes, checked for what it must be before any work starts, and without
leaving anything behind (no folder is created to find out whether one could be).

`output_file`: a file this run will write (`--trace`, `--json`); `output_dir`: a folder it will
fill (`--out`, `--checkpoint-dir`); `input_file`: a file it reads (`jaxdp diff A B`). Each raises
ConfigError in one line naming the flag, the path and the fix.
"""
from __future__ import annotations

import os

from .errors import ConfigError


def _nearest_existing(path: str) -> str:
    """The path itself or its closest existing ancestor."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _creatable(path: str, flag: str) -> None:
    """`path` does not exist yet: its closest existing ancestor must be a writable folder."""
    base = _nearest_existing(os.path.dirname(os.path.abspath(path)))
    if not os.path.isdir(base):
        raise ConfigError(f"{flag} {path}: {base} is a file, not a folder; choose a path under a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: folder {base} is not writable; choose a writable path")


def output_file(path, flag: str) -> None:
    """A file to be written at the end of the run: not a folder, and writable where it will go."""
    path = os.fspath(path)
    if not path.strip():
        raise ConfigError(f"{flag} is empty; give a file path, e.g. {flag} runs/run.npz")
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path}: is a folder; give a file path, e.g. {flag} {os.path.join(path, 'run.npz')}")
    if os.path.exists(path):
        if not os.path.isfile(path):  # a device or pipe (/dev/full): the atomic rename would replace it
            raise ConfigError(f"{flag} {path}: not a regular file (a device or pipe); give a file path")
        if not os.access(path, os.W_OK):
            raise ConfigError(f"{flag} {path}: the file is not writable; choose another path")
        return
    _creatable(path, flag)


def output_dir(path, flag: str) -> None:
    """A folder to be created or filled: not a file, and writable."""
    path = os.fspath(path)
    if not path.strip():
        raise ConfigError(f"{flag} is empty; give a folder, e.g. {flag} reports/run")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{flag} {path}: is a file, not a folder; give a folder path")
    if os.path.isdir(path):
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{flag} {path}: the folder is not writable; choose another")
        return
    _creatable(os.path.join(path, "x"), flag)


def input_file(path, flag: str) -> None:
    """A file to be read: it exists and is a file."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ConfigError(f"{flag} {path}: no such file")
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path}: is a folder, not a file")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{flag} {path}: the file is not readable")
