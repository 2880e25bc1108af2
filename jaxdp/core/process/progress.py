"""Where a run is, for the one line a run stopped by Ctrl-C prints (docs/TRACE.md, "Interrupting a run"):
the last step done and what the run has kept on disk (a checkpoint, a trace).

Both frameworks' training loops update `NOW` (`step_done`, `kept`). A child process (a rank that
torch_ref spawned, a `jaxdp train --processes` process) reports to its launcher through the small JSON
file named by the environment variable JAXDP_PROGRESS_FILE (`channel` makes one; `merge` reads it
back). Children are started with SIGINT blocked (`sigint_left_to_this_process`): the terminal sends SIGINT
to the whole process group, and the launcher alone answers it, stopping and reaping its children. Ctrl-C
is never ignored in the launcher, only deferred (`sigint_deferred`): a checkpoint being saved, children
being started or reaped complete, then the run stops with status 130.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading

ENV = "JAXDP_PROGRESS_FILE"


class Progress:
    """The last step done (0: none yet) and what was kept, {path: words} ("checkpoint step 4 in DIR")."""

    def __init__(self):
        self.step = 0
        self.kept: dict[str, str] = {}
        self._file: tuple[str, int] | None = None  # (path, fd) of the report, opened on first use

    def report(self) -> None:
        """Rewrite the JAXDP_PROGRESS_FILE report, when this process has one (a few bytes per step)."""
        path = os.environ.get(ENV)
        if not path:
            return
        if self._file is None or self._file[0] != path:
            self._file = (path, os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        data = json.dumps({"step": self.step, "kept": self.kept}).encode()
        os.pwrite(self._file[1], data, 0)
        os.ftruncate(self._file[1], len(data))


NOW = Progress()


def reset() -> None:
    """No step done, nothing kept (a process that runs several commands, as a test session does)."""
    NOW.step, NOW.kept = 0, {}


def step_done(k: int) -> None:
    """Step `k` is done (a loop calls it with its first step - 1 before it starts)."""
    NOW.step = int(k)
    NOW.report()


def kept(path, words: str) -> None:
    """`path` holds what a stopped run keeps (a later call for the same path replaces the words)."""
    NOW.kept[os.fspath(path)] = words
    NOW.report()


def line(prog: str) -> str:
    """The one line: `prog: interrupted at step k; nothing written` (or `; kept ...`)."""
    kept_words = ", ".join(NOW.kept.values())
    return f"{prog}: interrupted at step {NOW.step}; " + (f"kept {kept_words}" if kept_words else "nothing written")


def read(path) -> tuple[int, dict[str, str]]:
    """(step, kept) from a child's report; (0, {}) while it has written none (or is writing one)."""
    try:
        with open(path) as f:
            got = json.load(f)
        return int(got["step"]), dict(got["kept"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0, {}


def merge(path) -> None:
    """Take a (stopped) child's report as this process's progress."""
    step, child_kept = read(path)
    NOW.step = max(NOW.step, step)
    NOW.kept.update(child_kept)


@contextlib.contextmanager
def channel():
    """The report file a launcher hands its first child: JAXDP_PROGRESS_FILE when this process was given
    one (the child then reports there too), else a new temporary file, removed at the end."""
    given = os.environ.get(ENV)
    if given:
        yield given
        return
    fd, path = tempfile.mkstemp(prefix="jaxdp-progress-", suffix=".json")
    os.close(fd)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


@contextlib.contextmanager
def sigint_deferred():
    """Ctrl-C during the block (a checkpoint being saved, children being reaped) takes effect when the block
    ends: the block completes, then KeyboardInterrupt is raised as usual (not raised again when the block
    itself ends by an exception: that one goes on up). Never ignored: a Ctrl-C is never lost. A process
    started with Ctrl-C ignored (a rank, a `--processes` child, `nohup`) keeps ignoring it."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigint_left_to_this_process():
    """Start children in the block: they start with SIGINT blocked (a thread's signal mask is inherited across
    fork and exec, and a Python child never unblocks it), so that the terminal's Ctrl-C, sent to the whole
    process group, stays pending in them and is answered by this process alone, which stops them. Here
    Ctrl-C is deferred meanwhile (`sigint_deferred`), never ignored: blocked in this thread, a SIGINT is taken
    by another thread of this process or stays pending until the block ends, then KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with sigint_deferred():
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a pending SIGINT is delivered now, and deferred
