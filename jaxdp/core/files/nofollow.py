"""The checkpoint folder's entries read, checked and deleted without following a symbolic link, in both
frameworks: a link in `--checkpoint-dir` may point anywhere, and a run creates, truncates, writes or deletes
nothing outside that folder and the paths the user named. (The folder itself, named by the user, may be a
link: it is followed, as any path a user names is.)

- `kind(path)`: None for a regular file, a folder or nothing at all; otherwise what it is, in words
  ("a symbolic link to '/x'", "a FIFO"): never a checkpoint's entry.
- `refuse(root, names, deep)`: ConfigError (exit 2) naming the first entry of `root` among `names` (and,
  with `deep`, anything below them) that `kind` objects to, and the fix.
- `open_plain(path)`: a regular file opened for reading, never through a link (O_NOFOLLOW) and never
  blocking on a FIFO; OSError otherwise.
- `is_folder(path)`: a folder, not a link to one.
- `remove(path)`: a link unlinked (what it points to is left as it is), a folder deleted with what it holds
  (`shutil.rmtree` unlinks, never follows, the links inside), a file unlinked; an error is raised, never
  ignored; a path that is not there is no error.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat

from ..errors import ConfigError

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def kind(path) -> str | None:
    """What `path` is when it is neither a regular file, a folder nor absent; None otherwise."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        target = ""
        with contextlib.suppress(OSError):
            target = f" to {os.readlink(path)!r}"
        return f"a symbolic link{target}"
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((words for test, words in _KINDS if test(mode)), "not a file or folder")


def refusal(root, path, what: str) -> ConfigError:
    return ConfigError(f"--checkpoint-dir {root}: {path} is {what}; a run never follows a link or opens anything "
                       f"but files and folders in the folder it writes and deletes in: remove it (what a link "
                       f"points to is left as it is), or give another --checkpoint-dir")


def refuse(root, names, deep: bool = False) -> None:
    """Raise `refusal` for the first of `root`'s entries `names` (with `deep`: or below them) that is a link
    or not a file or folder. `os.walk` does not follow links: a linked folder is met as an entry."""
    for name in sorted(names):
        path = os.path.join(root, name)
        if (what := kind(path)) is not None:
            raise refusal(root, path, what)
        if deep and is_folder(path):
            for here, folders, files in os.walk(path):
                for entry in sorted(folders + files):
                    if (what := kind(os.path.join(here, entry))) is not None:
                        raise refusal(root, os.path.join(here, entry), what)


def is_folder(path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def open_plain(path, mode: str = "rb"):
    """`path` opened for reading when it is a regular file; OSError when it is a link or anything else."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


def remove(path) -> None:
    """Delete `path` itself, never what a link points to; raise on failure."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)
