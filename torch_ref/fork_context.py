"""How torch_ref starts its ranks: multiprocessing's 'forkserver'. A server process, started once by the
launcher, imports torch and torch_ref (`torch_ref.rank_server`, `PRELOAD`) and forks every rank from itself,
so a rank starts in a fraction of a second where 'spawn' imported torch again in each (about 4 CPU-seconds a
rank; a world of 4 took 4.5 s to start on 2 cores, a world after the first now takes 0.15 s). A rank takes the
launcher's environment from the launcher (`launch._entry`), not the server's.

Starting a rank waits for the server's imports (`Process.start` reads the new pid from it): minutes on a loaded
machine, for ever if they hang. So `start` starts the ranks from a thread while the launcher watches the start-up
limit (`jaxdp.core.process.heartbeat`), and `started` stops a server that has not finished by then.
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
from multiprocessing import forkserver
from multiprocessing import util as mp_util

import torch.multiprocessing as mp

from jaxdp.core.process import progress

PRELOAD = ["torch_ref.rank_server"]  # the fork server's start-up: bound to its launcher, torch imported once
OPTIONAL = ("transformers",)  # imported by the server too when the launcher has imported them (below)


def preload() -> list[str]:
    """`PRELOAD`, then the optional libraries the launcher has already imported: a launcher that built a
    transformers model starts ranks that build it, and each rank would import transformers again (about 1.2
    CPU-s). Not its model modules: importing `modeling_utils` runs a torch operation that starts torch's
    intra-op thread pool, and a pool started before the fork is one a rank with several threads may hang on."""
    return PRELOAD + [name for name in OPTIONAL if name in sys.modules]


def short_socket_folder() -> None:
    """multiprocessing makes its folder (the fork server's socket) under TMPDIR, and before Python 3.13 a long
    TMPDIR overflows AF_UNIX's 108 bytes ('AF_UNIX path too long'): that folder is then made in the system's
    temporary folder (removed at exit by multiprocessing)."""
    if len(os.path.join(tempfile.gettempdir(), "pymp-12345678", "listener-12345678")) < 100:
        return
    saved = tempfile.tempdir
    tempfile.tempdir = "/tmp" if os.path.isdir("/tmp") else saved
    try:
        mp_util.get_temp_dir()
    finally:
        tempfile.tempdir = saved


def context():
    """The 'forkserver' context, its server started here (Ctrl-C left to this process) on `preload()`
    (`torch_ref.rank_server` first); a server from an earlier launch is reused while it runs."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(preload())
    short_socket_folder()
    with progress.sigint_left_to_this_process():
        forkserver.ensure_running()
    return ctx


def start(procs, failed) -> threading.Thread:
    """Start `procs` in order from a thread (each waits for the server's imports); `failed(rank, error)` when a
    start raises (the server died), and no later rank is started."""
    def run():
        for rank, p in enumerate(procs):
            try:
                p.start()
            except Exception as e:  # noqa: BLE001  (reported to the launcher as that rank's error)
                failed(rank, e)
                return

    thread = threading.Thread(target=run, daemon=True, name="torch_ref-start")
    thread.start()
    return thread


def started(procs, starting: threading.Thread) -> list:
    """The ranks of `procs` that started, once no more can: a start still waiting for the server (its imports
    not finished within the start-up limit) ends with the server, killed (it is restarted by the next launch;
    ranks forked from it die with it, `jaxdp.core.process.lifeline`)."""
    if starting.is_alive():
        pid = forkserver._forkserver._forkserver_pid  # multiprocessing keeps the server's pid here only
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        starting.join(timeout=10.0)
    return [p for p in procs if p.pid is not None]
