"""A full disk, found wherever a library put it, answered in one line naming the path and the cause (exit 3).

A write that finds no room fails in many shapes: Python's own OSError(ENOSPC) (a trace, a report, the
manifest), often with no file name (the error comes from a `write` or `close`, not the `open`); orbax's writer,
tensorstore, raises `ValueError('RESOURCE_EXHAUSTED: Failed writing: "PATH": ... No space left on device
[os_error_code='28']')`; torch.distributed.checkpoint wraps each rank's OSError in a `CheckpointException`
(a BaseException) whose `failures` map ranks to (exception, stack) pairs. `find` walks all of it: the cause
and the context of each exception, an exception group's members, DCP's failures and exceptions passed as
arguments, and takes a real OSError first, then a library's message that names the errno.

'No room' is ENOSPC (the disk), EDQUOT (the quota) or EFBIG (the file-size limit, RLIMIT_FSIZE): the run
cannot write what it must, and the line says which with the system's words ('No space left on device').
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import sys

from ..errors import RunFailed

ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
CODE = re.compile(r"os_error_code='?(\d+)|\[Errno (\d+)\]")  # tensorstore's, and an OSError's repr in a message
QUOTED = re.compile(r'Failed writing: "([^"]+)"|"(/[^"]+)"')  # tensorstore quotes the file (and its database)
WORDS = {os.strerror(code): code for code in ROOM}
ROOM_LEFT = 64 << 10  # bytes: a disk with less than this left for the run is full (a write needs a block or more)


class DiskFull(RunFailed):
    """No room to write a file the run must write (exit 3); the message is the one line: what, path, cause."""


def causes(error: BaseException):
    """`error` and every exception reachable from it, breadth first, each once."""
    seen, todo = set(), [error]
    while todo:
        e = todo.pop(0)
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, *getattr(e, "exceptions", ()), *e.args]
        failures = getattr(e, "failures", None)  # DCP's CheckpointException: {rank: (exception, stack)}
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) and f else f for f in failures.values()]


def _from_text(text: str) -> OSError | None:
    """An OSError from a library's message that names a no-room errno (or its words), with its quoted path."""
    codes = [int(a or b) for a, b in CODE.findall(text)]
    code = next((c for c in codes if c in ROOM), None)
    if code is None:
        code = next((c for words, c in WORDS.items() if words in text), None)
    if code is None:
        return None
    quoted = QUOTED.findall(text)
    path = next((f for f, _ in quoted if f), None) or next((a for _, a in quoted if a), None)
    return OSError(code, os.strerror(code), path)


def find(error: BaseException) -> OSError | None:
    """The no-room OSError behind `error` (its file name when it has one), or None: not a full disk."""
    if isinstance(error, (KeyboardInterrupt, SystemExit)):
        return None
    chain = list(causes(error))
    found = next((e for e in chain if isinstance(e, OSError) and e.errno in ROOM), None)
    if found is not None:
        return found
    return next((o for e in chain if not isinstance(e, OSError) and (o := _from_text(str(e))) is not None), None)


def no_room(where) -> OSError | None:
    """ENOSPC for `where` when the disk holding it has next to no room left (under ROOM_LEFT bytes for this user),
    else None: for a failed write whose library lost the errno (torch's zip writer, in a rank of a DCP save:
    'RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598')."""
    folder = os.path.abspath(os.fspath(where))
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(where)) if free < ROOM_LEFT else None


def line(full: OSError, where=None, what: str = "") -> str:
    """'WHAT: PATH: No space left on device' (`where`: the path when the error names none)."""
    path = full.filename if full.filename is not None else where
    head = f"{what}: " if what else ""
    return f"{head}{os.fspath(path)}: {full.strerror}" if path is not None else f"{head}{full.strerror}"


@contextlib.contextmanager
def answered(what: str, where=None, then=None):
    """Inside the block, a full disk anywhere in what is raised (or any failure while the disk of `where` has no
    room left: `no_room`) becomes one DiskFull line: `what` (e.g. 'checkpoint step 3 not saved'), the path
    (`where` when the library named none) and the cause. `then()` runs first (the
    cleanup of what the failed write left, a torn save; what it returns ends the line: what was kept)."""
    quiet_closed_loop()
    try:
        yield
    except BaseException as e:
        stopped = isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit))  # not a failed write
        full = find(e) or (no_room(where) if where is not None and not stopped else None)
        if full is None:
            raise
        try:
            after = then() if then is not None else None
        except Exception:  # noqa: BLE001 - the cleanup's own failure must not hide the full disk's line
            after = None
        raise DiskFull(line(full, where, what) + (f"; {after}" if after else "")) from None


CLOSED_LOOP = "Event loop is closed"


def quiet_closed_loop() -> None:
    """From a save on: when it finds no room, tensorstore's writer threads still call back into orbax's event loop,
    closed with the failed save, and each call is an unraisable `RuntimeError('Event loop is closed')` that Python
    prints with its traceback (`sys.unraisablehook`, with no object: no "Exception ignored" line), while the save
    is still failing: 7-97 lines before the one line in 3 of 3 runs. Those are dropped, as is asyncio's log of
    the save's futures that failed for want of room (after it); any other error goes where it went."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_closed_loops", False):
        return

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == CLOSED_LOOP:
            return
        previous(unraisable)

    hook.drops_closed_loops = True
    sys.unraisablehook = hook
    logging.getLogger("asyncio").addFilter(_not_a_full_disk)


def _not_a_full_disk(record: logging.LogRecord) -> bool:
    """asyncio's log of a future whose error nobody read (`_GatheringFuture exception was never retrieved`, when
    the failed save's futures are collected): dropped when that error is the full disk the one line has said."""
    error = record.exc_info[1] if record.exc_info else None
    return not (isinstance(error, BaseException) and find(error) is not None)
