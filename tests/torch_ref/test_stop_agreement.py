"""The ranks' agreement on the step to stop after (torch_ref/stop_agreement.py), in a gloo world of one rank in
this process (the real runs of two ranks and under torchrun: tests/jaxdp/core/process/test_stop.py): checks spaced by
the steps' time, a signal asked between two checks returned at the next but one, the same step on every rank
because it comes only from all-reduced values."""
from __future__ import annotations

import signal
import time

import torch

from jaxdp.core.process import stop
from tests.torch_helpers import world_of_one
from torch_ref import stop_agreement


def test_a_signal_is_agreed_at_the_second_check_and_checks_are_spaced_by_time(monkeypatch):
    monkeypatch.setattr(stop, "NOW", stop.Request())
    with world_of_one():
        agreement = stop_agreement.Agreement(2, torch.device("cpu"))  # a world of 2 takes the collective path
        assert agreement.after_step(1) == 0 and agreement.next == 2  # the first check: the next step
        time.sleep(0.2)  # a step slower than CHECK_S: checks stay one step apart
        assert agreement.after_step(2) == 0 and agreement.next == 3
        assert agreement.after_step(3) == 0 and agreement.next == 4  # agreed at 2: one step (slow steps)
        for k in range(4, 30):  # fast steps: the checks grow apart
            agreement.after_step(k)
        assert agreement.next - agreement.since[0] > 1
        stop.NOW.signum = signal.SIGTERM  # asked between two checks
        k, checks, signum = 30, 0, 0
        while not signum and k < 10 * stop_agreement.MOST_STEPS:
            checks += agreement.next <= k
            signum, k = agreement.after_step(k), k + 1
        assert (signum, checks) == (signal.SIGTERM, 2)  # the check that sends it, the one that reads it
        assert agreement.pending is None and agreement.close() == (0, 1)
        assert stop_agreement.Agreement(1, torch.device("cpu")).after_step(1) == signal.SIGTERM  # one rank: at once
