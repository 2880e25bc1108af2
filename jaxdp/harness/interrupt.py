"""Ctrl-C answered in one line: `@guarded("jaxdp")` on a command's `main` turns KeyboardInterrupt into
`jaxdp: interrupted at step k; nothing written` (or `; kept checkpoint step 4 in DIR`) on stderr and
exit status 130 (128 + SIGINT, what a shell reports for a process that Ctrl-C ended), instead of a
traceback. The step and what was kept come from `jaxdp.core.process.progress`, which the training loops and
the launchers update; the writers (`jaxdp.core.files.atomic`) leave no half-written file and no empty folder.

A closed output pipe (`jaxdp diff A B | head -2`: `head` exits after two lines) ends the command quietly
with status 141 (128 + SIGPIPE), what a shell reports for `cat`, `grep` or `seq` ended the same way, so
that `set -o pipefail` scripts see us as they see them; no traceback, no error line (the reader asked for
no more). A BrokenPipeError from anything but stdout (a rank's pipe) stays an error.
"""
from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import sys
import threading

from ..core.process import progress, stop

EXIT_STATUS = 130  # Ctrl-C; SIGTERM: 143 (jaxdp.core.process.stop)
EXIT_PIPE = 141  # 128 + SIGPIPE


def stdout_closed() -> bool:
    """The reader of this process's stdout has gone (a pipe whose other end is closed)."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def quiet_exit() -> int:
    """Stdout's reader has gone: point stdout at /dev/null (the interpreter's last flush then writes
    nowhere instead of printing 'Exception ignored ... BrokenPipeError') and answer 141."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return EXIT_PIPE


def guarded(prog: str):
    """Decorate a command's `main(argv=None) -> int`."""

    def wrap(main):
        @functools.wraps(main)
        def run(*args, **kwargs) -> int:
            previous = stop.on_sigterm()  # SIGTERM answered as Ctrl-C is, with 143
            try:
                return answered(*args, **kwargs)
            finally:
                if previous is not None:  # a command run in a test's process leaves SIGTERM as it was
                    signal.signal(signal.SIGTERM, previous)

        def answered(*args, **kwargs) -> int:
            try:
                status = main(*args, **kwargs)
                sys.stdout.flush()  # what is still buffered meets a closed pipe here, not at exit
                return status
            except SystemExit:  # argparse's -h or error: its output flushed here too
                try:
                    sys.stdout.flush()
                except BrokenPipeError:
                    if stdout_closed():
                        raise SystemExit(quiet_exit()) from None
                raise
            except BrokenPipeError:
                if not stdout_closed():
                    raise  # a rank's pipe, not the reader of stdout: the command answers it (an error line)
                return quiet_exit()
            except KeyboardInterrupt as e:
                if threading.current_thread() is threading.main_thread():
                    for s in stop.SIGNALS:  # a second Ctrl-C (or SIGTERM) ends the exit at once
                        signal.signal(s, signal.SIG_DFL)
                with contextlib.suppress(OSError, ValueError):  # stdout closed or gone: the line still goes out
                    sys.stdout.flush()
                print(progress.line(prog), file=sys.stderr, flush=True)
                return stop.status(e)

        return run

    return wrap
