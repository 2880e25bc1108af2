"""A run stopped by a signal: SIGTERM (what a scheduler sends before it kills) and SIGINT (Ctrl-C) end a training
run after the step in progress, with one more checkpoint where `--checkpoint-dir` is given, and the exit status
a shell reports for a process the signal ended: 130 = 128 + SIGINT, 143 = 128 + SIGTERM (docs/ERRORS.md).

`Stopped` is a KeyboardInterrupt (every path that already answers Ctrl-C answers it: checkpoints kept, the
one line, children reaped) that carries its signal. `guarded` (jaxdp/harness/interrupt.py) raises it for
SIGTERM anywhere in a command (`on_sigterm`); a training loop defers both signals to the end of its step
(`deferred`), so that the step completes and is saved. Several processes must stop at the same step: JAX's
multi-process runs take the step from JAX's preemption sync point (jaxdp/train.py), torch's ranks all-reduce
the `asked` flag at checks about 50 ms of training apart (torch_ref/stop_agreement.py), and the launchers
forward the signal to every worker.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """A stop asked by signal `signum`; `status` = 128 + signum, as a shell reports it."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def status(self) -> int:
        return 128 + self.signum


def status(e: BaseException) -> int:
    """The exit status for an interrupt `e`: Stopped's, 130 for a plain KeyboardInterrupt."""
    return e.status if isinstance(e, Stopped) else 128 + signal.SIGINT


def signum_of(code: int | None) -> int | None:
    """The signal a worker's exit status `code` says stopped it (130, 143; -2, -15: killed by it before it could
    answer, as a Popen reports it), else None."""
    if code in [128 + s for s in SIGNALS]:
        return code - 128
    return -code if code in [-s for s in SIGNALS] else None


def _raise(signum, frame):
    raise Stopped(signum)


def on_sigterm():
    """SIGTERM raises Stopped(SIGTERM) in this process's main thread, as SIGINT raises KeyboardInterrupt; not where
    SIGTERM is ignored, nor outside the main thread. Returns the handler it replaced (None: none replaced)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    if previous in (signal.SIG_IGN, None):  # ignored, or a handler not set from Python
        return None
    signal.signal(signal.SIGTERM, _raise)
    return previous


class Request:
    """The signal asked while a loop runs (`signum`, None: none); before `armed` (the first step done) a signal
    raises at once (nothing would be saved: a compile is cut short), as does a second one."""

    def __init__(self):
        self.signum: int | None = None
        self.armed = False

    def handle(self, signum, frame) -> None:
        if self.signum is not None or not self.armed:
            raise Stopped(signum)
        self.signum = int(signum)


NOW = Request()


def asked() -> int | None:
    """The signal asked of the loop running in this process, or None."""
    return NOW.signum


@contextlib.contextmanager
def deferred(signals=SIGNALS, notice: int | None = None):
    """In the block `signals` are recorded in `NOW` (`asked`) and the loop stops after its step. With `notice`,
    each also sends this process signal `notice` (JAX's preemption notice: SIGTERM) for another handler to see.
    Nothing outside the main thread; a signal ignored (a child that must leave it to its launcher) stays so."""
    global NOW
    NOW = request = Request()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    handled = [s for s in signals if signal.getsignal(s) != signal.SIG_IGN]

    def handle(signum, frame):
        request.handle(signum, frame)
        if notice is not None:
            os.kill(os.getpid(), notice)

    previous = {s: signal.signal(s, handle) for s in handled}
    unblocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, handled)
    try:
        yield request
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        for s, handler in previous.items():
            signal.signal(s, handler)
