"""Which worker stopped: each worker's thread touches its own file every `--heartbeat` / 4 seconds, and
the launcher names the worker whose file has gone quiet for a whole `--heartbeat` interval.

A stopped process (SIGSTOP, a debugger, a swapped-out or frozen host) stops all its threads, so its
beat stops; a peer blocked in a collective waiting for it still beats (the thread runs beside the
collective, which holds no GIL). So the launcher names the one that stopped, not the peer whose
collective times out first. The interval counts from a worker's first beat: before it (starting Python,
importing torch in torch_ref's fork server: minutes on a loaded machine) the start-up limit applies,
`--startup-timeout` (STARTUP_S by default), and a worker with no beat by then is named as not started.
A worker beats at least every BEAT_S, so when a peer fails first (JAX's own 15 s heartbeat aborts the
processes waiting for a stopped one) a worker quiet for STALE_S is known to have stopped, and is named
as the cause, whatever `--heartbeat` is.

Worker side: `start(path, interval_s)` (a daemon thread; `from_env` for a `jaxdp train --processes`
child). Launcher side: `Watch(n, interval_s, startup_s)`: a temporary folder of n beat files, `stopped()`
the worker that stopped beating or never started (and the launcher's one line), `close()`. The launcher reads
only the files' times; each file holds its worker's pid, for the operator. A command that starts ranks deep
inside (`jaxdp compare`, `parity`, `bench`) runs under `configured(--heartbeat, --startup-timeout)`, and a
launch given no limits takes them (`limits`); they are put back after the command.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time

ENV_FILE, ENV_S = "JAXDP_HEARTBEAT_FILE", "JAXDP_HEARTBEAT_S"
DEFAULT_S = 60.0
STARTUP_S = 600.0  # before the first beat (--startup-timeout): starting Python, importing JAX or torch, under load
BEAT_S = 1.0  # the longest time between two beats (every --heartbeat / 4 when that is shorter)
STALE_S = 8 * BEAT_S  # quiet this long while a peer failed: stopped (a busy machine may delay a beat a few s)


_configured = {"interval_s": DEFAULT_S, "startup_s": STARTUP_S}


@contextlib.contextmanager
def configured(interval_s: float | None, startup_s: float | None):
    """Within the block, the limits of launches given none (a command's --heartbeat and --startup-timeout;
    None keeps the one before); put back after it."""
    before = dict(_configured)
    _configured.update({k: v for k, v in (("interval_s", interval_s), ("startup_s", startup_s)) if v is not None})
    try:
        yield
    finally:
        _configured.update(before)


def limits(interval_s: float | None = None, startup_s: float | None = None) -> tuple[float, float]:
    """(interval, start-up limit): those given, else the configured ones."""
    return (interval_s if interval_s is not None else _configured["interval_s"],
            startup_s if startup_s is not None else _configured["startup_s"])


def _beat(path: str, every_s: float) -> None:
    try:
        with open(path, "w") as f:
            f.write(str(os.getpid()))  # for the operator (and the tests): which process is worker i
    except OSError:
        return
    while True:
        try:
            os.utime(path)
        except OSError:  # the launcher removed the folder: the run is over
            return
        time.sleep(every_s)


def start(path: str | None, interval_s: float) -> None:
    """Touch `path` now and every min(`interval_s` / 4, BEAT_S) from a daemon thread; nothing when `path` is None."""
    if path is None:
        return
    every_s = min(interval_s / 4, BEAT_S)
    threading.Thread(target=_beat, args=(path, every_s), daemon=True, name="jaxdp-heartbeat").start()


def from_env() -> tuple[str, float] | tuple[None, float]:
    """(beat file, interval) a `jaxdp train --processes` child was given (ENV_FILE, ENV_S), else (None, _)."""
    return os.environ.get(ENV_FILE) or None, float(os.environ.get(ENV_S, DEFAULT_S))


class Watch:
    """The launcher's view of `n` workers' beats, every one at most `interval_s` old."""

    def __init__(self, n: int, interval_s: float, startup_s: float = STARTUP_S):
        self.folder = tempfile.mkdtemp(prefix="jaxdp-heartbeat-")
        self.n, self.interval_s, self.startup_s, self.started = n, interval_s, startup_s, time.time()

    def path(self, i: int) -> str:
        return os.path.join(self.folder, str(i))

    def age(self, i: int) -> float | None:
        """Seconds since worker i's last beat, or None before its first."""
        try:
            return time.time() - os.stat(self.path(i)).st_mtime
        except FileNotFoundError:
            return None

    def silent(self, running, after_s: float | None = None) -> tuple[int, float] | None:
        """(worker, seconds without a beat) of the quietest of the `running` workers (indices) that has
        beaten and been quiet since longer than `after_s` (default: the interval), or None."""
        ages = [(i, self.age(i)) for i in running]
        late = [(i, a) for i, a in ages if a is not None and a > (after_s or self.interval_s)]
        return max(late, key=lambda ia: ia[1]) if late else None

    def unstarted(self, running) -> tuple[int, float] | None:
        """(worker, seconds waited) of the first of the `running` workers with no beat after the start-up
        limit, or None."""
        waited = time.time() - self.started
        late = [i for i in running if waited > self.startup_s and self.age(i) is None]
        return (late[0], waited) if late else None

    def stopped(self, running, who: str, after_s: float | None = None) -> tuple[int, str] | None:
        """(worker, the launcher's one line) for a running worker quiet for `after_s` (default: the interval)
        since its last beat or, without `after_s`, one with no first beat within the start-up limit; or None."""
        quiet = self.silent(running, after_s)
        if quiet is not None:
            return quiet[0], message(f"{who} {quiet[0]}", quiet[1])
        late = None if after_s is not None else self.unstarted(running)
        if late is not None:
            return late[0], (f"{who} {late[0]} did not start within {late[1]:.0f} s (no first heartbeat; a "
                             f"loaded machine may need a longer --startup-timeout); stopping the others")
        return None

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def message(who: str, seconds: float) -> str:
    """The one line a launcher prints: 'process 1 stopped responding (no heartbeat for 60 s); ...'."""
    return f"{who} stopped responding (no heartbeat for {seconds:.0f} s); stopping the others"
