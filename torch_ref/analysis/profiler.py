"""`torch.profiler.profile` without kineto's start/stop markers on stderr: everything else it prints kept.

libkineto (torch 2.13's, kineto PR #1325) logs a line at every profiler start and stop,
`USDT:<date> <pid>:<tid> SyncActivityProfilerHandler.cpp:52] profiler_start` (and `:59] profiler_stop`),
straight to the C++ `std::cerr` (file descriptor 2, not Python's `sys.stderr`). Its only switch is the
severity threshold: torch sets it to ERROR (`suppressLibkinetoLogMessages`) unless `KINETO_LOG_LEVEL` is
set, and the USDT level (5) sits above ERROR (3), so the markers pass; a threshold above USDT
(`KINETO_LOG_LEVEL=6`) would hide kineto's real errors with them. Instead, `quiet_markers` points fd 2
at a temporary file while the profiler starts, runs and stops, then writes back to the real stderr every
line except the markers (`MARKER`): errors and warnings from any layer still appear, after the block.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

MARKER = re.compile(rb"^USDT:.*\] profiler_(start|stop)\r?$")


def drop_markers(text: bytes) -> bytes:
    """`text` without kineto's start/stop marker lines."""
    return b"".join(line for line in text.splitlines(keepends=True) if not MARKER.match(line.rstrip(b"\n")))


@contextlib.contextmanager
def quiet_markers():
    """While inside: fd 2 goes to a temporary file; on leaving, it is written back to fd 2 less the markers."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = memoryview(drop_markers(held.read()))
            while kept:
                kept = kept[os.write(2, kept):]


@contextlib.contextmanager
def profile(**kwargs):
    """`torch.profiler.profile(**kwargs)`, inside `quiet_markers`."""
    from torch.profiler import profile as torch_profile

    with quiet_markers(), torch_profile(**kwargs) as prof:
        yield prof
