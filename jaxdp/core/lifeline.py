"""A worker dies with its launcher: `jaxdp train --processes P`'s processes and torch_ref's spawned ranks
exit within a moment of their launcher's death, by any signal, SIGKILL included (no orphan trains on
and writes checkpoints after the launcher is gone).

Two mechanisms, because neither is enough alone:
- Linux's `prctl(PR_SET_PDEATHSIG, SIGKILL)`: the kernel kills the worker the instant its parent
  dies, even while it is blocked in C (a gloo collective, an XLA computation) holding no Python
  thread. Set in the worker itself, then `getppid()` is checked against the launcher's pid to close
  the race of a launcher that died before the call.
- a watcher thread polling `getppid()` every POLL_S (any POSIX system): the portable fallback, and
  a second line should the first be lost (the signal is tied to the parent *thread* that forked).

The launcher passes its pid down (`ENV` for a `jaxdp` child, an argument for a spawned rank), so a
worker started by hand on a cluster (no launcher) is left alone.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

ENV = "JAXDP_LAUNCHER_PID"
POLL_S = 0.5
PR_SET_PDEATHSIG = 1


def _pdeathsig() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux); False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _orphaned(launcher: int) -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # at once, as the kernel would: no atexit, no checkpoint, no barrier


def _watch(launcher: int) -> None:
    while os.getppid() == launcher:
        time.sleep(POLL_S)
    _orphaned(launcher)


def bind_to(launcher: int | None) -> None:
    """Make this worker die with process `launcher` (its parent); nothing when `launcher` is None."""
    if launcher is None:
        return
    _pdeathsig()
    if os.getppid() != launcher:  # the launcher died before the kernel was told
        _orphaned(launcher)
    threading.Thread(target=_watch, args=(launcher,), daemon=True, name="jaxdp-lifeline").start()


def from_env() -> int | None:
    """The launcher's pid a `jaxdp train --processes` child was given (`ENV`), or None."""
    value = os.environ.get(ENV, "")
    return int(value) if value.isdigit() else None
