"""Rank spread: how far the ranks' copies of a value the strategy holds replicated disagree, as the torch
Recorder writes it (`step/<k>/spread/<name>`, docs/TRACE.md "Rank spread") and as the judge and `jaxdp diff`
read it back (`findings`).

A trace holds one value per tensor: rank 0's. `step/<k>/spread/<name>` is the largest |a - b| over the
ranks' values of one element of tensor <name> after step k's update (NaN when a rank's value is not
finite), for every buffer and every parameter a rank holds whole; it is written only in a world of more
than one rank, so a trace may hold it or not, and it is never compared with the other trace's: it is a
property of the run that wrote it. A nonzero (or non-finite) spread is a finding, and the verdict:
- a parameter: fails. The strategy claims every rank holds the same parameters after the step; replicas
  that disagree train different models (a parameter updated on one rank only, a broadcast skipped).
- a buffer: fails, because the trace records rank 0's value while the others hold others, so the recorded
  state is not the run's (plain nn.BatchNorm under every strategy but DDP's: each rank's running
  statistics from its own rows, never reconciled) -- unless meta `broadcast_buffers` is true: the
  strategy wraps the model in DDP with broadcast_buffers=True (ddp, zero1), which gives every rank
  rank 0's buffers at the next step's first forward, so rank 0's values (the trace's) are the ones the
  run continues from. Then the finding is a note: the statistics are per rank, and after the last step
  the ranks' models still differ.
NaN is never agreement: a non-finite spread fails, parameter or buffer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .trace_keys import parse_key
from .tracefile import Trace

FIELD = "spread"
FIX = "torch_ref.batchnorm.convert_sync_batchnorm(model) makes BatchNorm's statistics those of the global batch"


def is_spread(key: str) -> bool:
    """True for `step/<k>/spread/<name>`."""
    parsed = parse_key(key)
    return parsed is not None and parsed.kind == FIELD


def without(t: Trace) -> Trace:
    """`t` without its spread keys (what two traces compare)."""
    return Trace(t.meta, {k: v for k, v in t.arrays.items() if not is_spread(k)})


@dataclass(frozen=True)
class Finding:
    """A tensor whose ranks disagreed in trace `side`: its largest `spread` (NaN: not finite) at `step`,
    the `first` step it was nonzero, `kind` 'parameter' or 'buffer', and whether it `fails` the verdict."""
    side: str
    name: str
    kind: str
    spread: float
    step: int
    first: int
    fails: bool
    broadcast: bool = False  # meta broadcast_buffers: rank 0's buffers replace the others' at the next forward

    def short(self) -> str:
        return f"{self.side}: {self.kind} {self.name}: the ranks differ by up to {self.spread:.3g} at step {self.step}"

    def describe(self) -> str:
        where = f"{self.side}: {self.kind} {self.name}"
        if math.isnan(self.spread):
            return (f"{where} is not finite on some rank at step {self.step} (spread NaN): the ranks cannot be "
                    f"shown to agree (NaN is never agreement)")
        head = (f"{where} differs across ranks by up to {self.spread:.3g} at step {self.step}"
                f"{f' (nonzero from step {self.first})' if self.first != self.step else ''}: ")
        if self.kind == "parameter":
            return head + ("the ranks disagree on a value the strategy holds replicated, so they no longer train one "
                           "model (a bug: e.g. a parameter updated or perturbed on one rank only); the trace holds "
                           "rank 0's")
        if self.broadcast:
            return head + ("per-rank statistics (e.g. plain nn.BatchNorm's running statistics under DDP); DDP's "
                           "broadcast_buffers=True gives every rank rank 0's at the next step's first forward, so the "
                           "trace holds what the run continues from, but after the last step the ranks' models "
                           f"differ; {FIX}")
        return head + ("the ranks disagree on a value the strategy holds replicated and nothing makes them equal "
                       "again: the trace holds rank 0's, so the recorded state is not the run's (e.g. plain "
                       f"nn.BatchNorm's running statistics are per rank under DDP-style strategies); {FIX}")


def findings(t: Trace, side: str) -> list[Finding]:
    """One `Finding` per tensor of `t` with a nonzero or non-finite spread at any step, by name."""
    per_name: dict[str, list[tuple[int, float]]] = {}
    for key, value in t.arrays.items():
        if is_spread(key):
            parsed = parse_key(key)
            per_name.setdefault(parsed.name, []).append((parsed.step, float(np.max(np.asarray(value, np.float64)))))
    params = set(t.names())
    broadcast = t.meta.get("broadcast_buffers") is True
    out = []
    for name, values in sorted(per_name.items()):
        values.sort()
        bad = [(k, v) for k, v in values if not v == 0.0]  # NaN included
        if not bad:
            continue
        nan = [(k, v) for k, v in bad if math.isnan(v)]
        step, worst = nan[0] if nan else max(bad, key=lambda kv: (kv[1], -kv[0]))
        kind = "buffer" if name not in params and _is_state(t, name) else "parameter"
        fails = math.isnan(worst) or kind == "parameter" or not broadcast
        out.append(Finding(side, name, kind, worst, step, bad[0][0], fails, broadcast and kind == "buffer"))
    return out


def split(a: Trace, b: Trace, sides=("a", "b")) -> tuple[list[Finding], Trace, Trace]:
    """Both traces' findings (their sides named `sides`) and the two traces without their spread keys."""
    return findings(a, sides[0]) + findings(b, sides[1]), without(a), without(b)


def failures(found: list[Finding]) -> list[str]:
    """The findings that fail the verdict, one line each."""
    return [f"spread: {f.describe()}" for f in found if f.fails]


def notes(found: list[Finding]) -> list[str]:
    """The findings that do not fail it (buffers DDP hands rank 0's to every rank), one line each."""
    return [f"spread: {f.describe()}" for f in found if not f.fails]


def _is_state(t: Trace, name: str) -> bool:
    return f"state/{name}" in t.arrays or any(k.endswith(f"/state/{name}") for k in t.arrays)
