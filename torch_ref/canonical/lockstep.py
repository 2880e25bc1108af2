"""This rank's shards' forwards in lockstep (canonical BatchNorm, issue 40): each shard's forward runs once,
pausing at every statistic it needs until the tree over all shards has computed it.

Canonical BatchNorm needs, before shard k's forward can pass BatchNorm layer l, mu_l and v_l: sums over
every shard's rows (batchnorm.py). Restarting each shard's forward from its input for every statistic costs
2L forward passes per shard before the one that keeps its graph. Here each shard's forward runs in its own
thread, once, with its graph: at each statistic it hands its partial sum over (`wait`) and sleeps until the
main thread, having every shard's partial sum, gives it the statistic. One thread runs at a time (a strict
hand-over: the main thread resumes shard 0, which runs until it hands over, then shard 1, ...), so the
computation is the sequence of operations of the passes it replaces (the same operations on the same
values: the same bits), in another order in time. Grad mode and autocast are per thread: a shard's thread
starts with grad mode on and enters whatever autocast its forward enters.
"""
from __future__ import annotations

import threading

from .reduce import CanonicalError


class _Abort(Exception):
    """Raised in a paused shard to end its thread when the step gives up on it."""


class Shard:
    """`fn(wait)` in its own thread; `wait(report)` (inside fn) hands `report` to the main thread and
    returns what `resume` gives next."""

    def __init__(self, fn):
        self.go, self.back = threading.Semaphore(0), threading.Semaphore(0)
        self.report = self.reply = self.result = self.error = None
        self.done = False
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True, name="canonical-shard")
        self.thread.start()

    def _run(self, fn) -> None:
        self.go.acquire()
        try:
            self.result = fn(self.wait)
        except _Abort:
            pass
        except BaseException as e:  # handed to the main thread, raised there
            self.error = e
        self.done = True
        self.back.release()

    def wait(self, report):
        """In the shard's thread: hand `report` over and sleep until resumed; returns the reply."""
        self.report = report
        self.back.release()
        self.go.acquire()
        if self.reply is _Abort:
            raise _Abort
        return self.reply

    def resume(self, reply=None):
        """In the main thread: run the shard until its next report (returned) or its end (None)."""
        self.reply, self.report = reply, None
        self.go.release()
        self.back.acquire()
        if self.error is not None:
            raise self.error
        return None if self.done else self.report

    def close(self) -> None:
        """End a shard still paused (an error elsewhere): its thread raises `_Abort` and ends."""
        if not self.done and self.thread.is_alive():
            self.resume(_Abort)
        self.thread.join()


def run(fns: list, rounds: int, statistic):
    """Start `fns` (one per shard, each `fn(wait)`), then `rounds` times: resume every shard in order with
    the last statistic (None at first), each handing over its report, and `statistic(round, reports)`
    computes the next; a last resume runs every shard to its end. Returns their results in order."""
    shards = [Shard(fn) for fn in fns]
    try:
        reply = None
        for r in range(rounds + 1):
            reports = [s.resume(reply) for s in shards]
            if r == rounds:
                break
            if any(s.done for s in shards):
                raise CanonicalError(_CALLS)
            reply = statistic(r, reports)
        if not all(s.done for s in shards):
            raise CanonicalError(_CALLS)
        return [s.result for s in shards]
    finally:
        for s in shards:
            s.close()


_CALLS = ("reduction='canonical' needs each of the model's BatchNorm layers called once per forward, in "
          "registration order; this forward called them otherwise; use reduction='native' for this model")
