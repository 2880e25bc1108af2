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

A torch_ref rank is forked by a fork server the launcher started (multiprocessing's 'forkserver': torch is
imported once, not once per rank), so its parent is that server, whose parent is the launcher
(`bind_to(..., through_server=True)`). The server binds itself to the launcher the same way when it starts
(`torch_ref/rank_server.py`), and the rank binds itself to the server: a dead launcher takes the server, and
the server its ranks. (multiprocessing's own rule, that the server exits once no process holds its "alive"
pipe, does not: every rank holds that pipe.)
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


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    _orphaned(parent)


def parent_of(pid: int) -> int | None:
    """Process `pid`'s parent (Linux: /proc/PID/stat), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def bind_to(launcher: int | None, through_server: bool = False) -> None:
    """Make this worker die with process `launcher`, its parent or (`through_server`) its parent's parent: a
    fork server that exits with the launcher. Nothing when `launcher` is None."""
    if launcher is None:
        return
    _pdeathsig()
    parent = os.getppid()
    if through_server and parent != launcher:
        up = parent_of(parent)
        if up is not None and up != launcher:  # the server's launcher is gone (or it is not ours)
            _orphaned(launcher)
    elif parent != launcher:  # the launcher died before the kernel was told
        _orphaned(launcher)
    threading.Thread(target=_watch, args=(parent,), daemon=True, name="jaxdp-lifeline").start()


def from_env() -> int | None:
    """The launcher's pid a `jaxdp train --processes` child was given (`ENV`), or None."""
    value = os.environ.get(ENV, "")
    return int(value) if value.isdigit() else None
