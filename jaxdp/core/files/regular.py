"""What is read as a file is a regular file: a device (/dev/zero, /dev/urandom), a FIFO or a socket named where
a file is read would be read forever, or block forever waiting for a writer.

Two guards, so that a path swapped between them is still never read endlessly:
- before any work, the CLIs check every file a user names for reading (`paths.input_file`: diff's traces)
  with `what` (a `stat`, nothing opened) and answer one line, exit 2;
- the readers open through `open_regular`: `stat` before the open (a device is never opened), then an
  open that cannot block (O_NONBLOCK: a FIFO without a writer) and `fstat` on the descriptor it reads
  from. What is not a regular file there raises `NotRegular`, an OSError (exit 3: the file changed
  under the run).
A path a user names may be a link to a regular file: it is followed. The checkpoint folder's own entries are
never followed, and a FIFO or device among them is refused the same way (`nofollow.py`: lstat, O_NOFOLLOW).
"""
from __future__ import annotations

import errno
import os
import stat

KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
         (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"),
         (stat.S_ISDIR, "a folder"))


def kind(mode: int) -> str:
    """What a file of `mode` is, in words ('a character device'); 'a regular file' for one."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in KINDS if test(mode)), "not a regular file")


class NotRegular(OSError):
    """A path read as a file is not a regular file; `one_line` shows 'PATH: is a FIFO (named pipe), not a
    regular file'."""

    def __init__(self, path, mode: int):
        super().__init__(errno.EINVAL, f"is {kind(mode)}, not a regular file", os.fspath(path))


def what(path) -> str | None:
    """None when `path` is a regular file (links followed); else what it is ('a character device'). A
    missing or unreadable path raises OSError, as `os.stat` does."""
    mode = os.stat(path).st_mode
    return None if stat.S_ISREG(mode) else kind(mode)


def open_regular(path, mode: str = "rb", **kwargs):
    """`open(path, mode)` for reading, refused (NotRegular) unless `path` is a regular file when checked and
    when opened: nothing else is opened, and the open never blocks."""
    path = os.fspath(path)
    if "r" not in mode or any(c in mode for c in "wax+"):
        raise ValueError(f"open_regular reads: mode {mode!r}")
    before = os.stat(path).st_mode
    if not stat.S_ISREG(before):  # a device is not even opened (opening one may act: a tape rewinds)
        raise NotRegular(path, before)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        now = os.fstat(fd).st_mode
        if not stat.S_ISREG(now):  # swapped since the stat
            raise NotRegular(path, now)
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise
