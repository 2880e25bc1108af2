"""Ctrl-C answered in one line: `@guarded("jaxdp")` on a command's `main` turns KeyboardInterrupt into
`jaxdp: interrupted at step k; nothing written` (or `; kept checkpoint step 4 in DIR`) on stderr and
exit status 130 (128 + SIGINT, what a shell reports for a process that Ctrl-C ended), instead of a
traceback. The step and what was kept come from `jaxdp.core.progress`, which the training loops and
the launchers update; the writers (`jaxdp.core.atomic`) leave no half-written file and no empty folder.
"""
from __future__ import annotations

import contextlib
import functools
import signal
import sys
import threading

from ..core import progress

EXIT_STATUS = 130


def guarded(prog: str):
    """Decorate a command's `main(argv=None) -> int`."""

    def wrap(main):
        @functools.wraps(main)
        def run(*args, **kwargs) -> int:
            try:
                return main(*args, **kwargs)
            except KeyboardInterrupt:
                if threading.current_thread() is threading.main_thread():
                    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a second Ctrl-C ends the exit at once
                with contextlib.suppress(OSError, ValueError):  # stdout closed or gone: the line still goes out
                    sys.stdout.flush()
                print(progress.line(prog), file=sys.stderr, flush=True)
                return EXIT_STATUS

        return run

    return wrap
