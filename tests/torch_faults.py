"""Faults injected into torch_ref's training from outside the library (nothing in `torch_ref/train.py`
knows of them): each a rank function that patches this rank's `torch_ref.train` before running its
`train_rank`, for `launch.launch` (spawned ranks import this module and find it by name), and a wrapper
entry point, `python -m tests.torch_faults FAULT RANK:STEP ARGV...`, that runs `python -m torch_ref ARGV`
with the fault in every rank.

  fail   that rank raises `InjectedFailure` as it starts that step (the failure path of the launcher);
  inf    that rank's gradient at that step gets an Inf while its loss stays finite (the non-finite check).
"""
from __future__ import annotations

import functools
import sys

import torch

from torch_ref import train


class InjectedFailure(RuntimeError):
    """Raised on purpose by the `fail` fault."""


def _at_step(rank: int, at: tuple[int, int], then) -> None:
    """On rank `at[0]`: `then(k)` as step k's batch is read; `then` returns whether step k is the one."""
    if rank != at[0]:
        return
    host_batch = train.host_batch

    def batch(cfg, dataset, k):
        then(k)
        return host_batch(cfg, dataset, k)

    train.host_batch = batch


def failing_rank(rank, world, cfg, init, record, device=None, *, at):
    """`train_rank` whose rank `at[0]` raises InjectedFailure as it starts step `at[1]`."""
    def fail(k):
        if k == at[1]:
            raise InjectedFailure(f"injected failure on rank {rank} at step {k}")

    _at_step(rank, at, fail)
    return train.train_rank(rank, world, cfg, init, record, device)


def inf_rank(rank, world, cfg, init, record, device=None, *, at):
    """`train_rank` whose rank `at[0]` adds to its loss at step `at[1]` a term whose value is 0 and whose
    gradient is Inf (sqrt at 0): a finite loss with a non-finite gradient."""
    step = [0]
    _at_step(rank, at, lambda k: step.__setitem__(0, k))
    cross_entropy = train.cross_entropy

    def poisoned(out, y):
        loss = cross_entropy(out, y)
        return loss + torch.sqrt(out[0, 0] - out[0, 0].detach()) if step[0] == at[1] else loss

    if rank == at[0]:
        train.cross_entropy = poisoned
    return train.train_rank(rank, world, cfg, init, record, device)


FAULTS = {"fail": failing_rank, "inf": inf_rank}


def with_fault(fault: str, spec: str):
    """`torch_ref.train.train_rank` replaced by the fault's rank function at "RANK:STEP" (in this process;
    the spawned ranks are given it by name). Returns the original, to put back."""
    rank, step = (int(v) for v in spec.split(":"))
    original = train.train_rank
    train.train_rank = functools.partial(FAULTS[fault], at=(rank, step))
    return original


def main(argv: list[str]) -> int:
    from jaxdp.harness import torch_cli
    from tests import torch_faults  # by its name, not __main__'s: the spawned ranks import it

    fault, spec, *rest = argv
    torch_faults.with_fault(fault, spec)
    return torch_cli.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
