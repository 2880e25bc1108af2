"""The step every rank stops after, when a signal reached one of them (`jaxdp.core.process.stop`): the torch
side of what
JAX's preemption sync point gives jaxdp's processes.

At a check, a rank starts an all-reduce (MAX) of two int32s, the signal it was asked (0: none) and minus the
number of steps it proposes until the next check, without waiting for it (`async_op`), and reads the one it
started at the previous check. Every rank reads the same values at the same step, so all stop together and all
agree on the next check. The proposal spaces checks about CHECK_S of training apart (one step apart for steps of
CHECK_S or more), so a tiny model's steps do not each pay a collective: a blocking all-reduce of one int cost
1.6 ms on 2 loaded cores with gloo, about an mlp step. A stop thus comes one or two checks after the signal.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from jaxdp.core.process import stop

CHECK_S = 0.05  # training time between two checks (at least one step)
MOST_STEPS = 1000  # between two checks


class Agreement:
    """`after_step(k)` after each step k: the signal to stop on (0: go on), the same on every rank of `world`."""

    def __init__(self, world: int, device: torch.device):
        self.world, self.device = world, device
        self.pending = None  # (work, values) of the all-reduce started at the previous check
        self.next, self.since = 0, None  # the next check's step; the last check's (step, time)

    def after_step(self, k: int) -> int:
        if self.world == 1:
            return stop.asked() or 0
        if k < self.next:
            return 0
        signum, steps = self.close()
        if not signum:
            now = time.perf_counter()
            proposal = 1 if self.since is None else self.proposal(k, now)
            values = torch.tensor([stop.asked() or 0, -proposal], dtype=torch.int32, device=self.device)
            self.pending = dist.all_reduce(values, op=dist.ReduceOp.MAX, async_op=True), values
            self.next, self.since = k + steps, (k, now)
        return signum

    def proposal(self, k: int, now: float) -> int:
        """Steps to the next check: about CHECK_S of steps as long as those since the last check."""
        last, t = self.since
        return max(1, min(MOST_STEPS, int(CHECK_S * (k - last) / max(now - t, 1e-9))))

    def close(self) -> tuple[int, int]:
        """Wait for the all-reduce in flight (a loop that ends must not leave one): (the signal agreed, the steps
        to the next check: the fewest any rank proposed); (0, 1) when none is."""
        if self.pending is None:
            return 0, 1
        work, values = self.pending
        self.pending = None
        work.wait()
        signum, steps = values.tolist()
        return int(signum), int(-steps)
