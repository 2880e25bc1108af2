"""The trace's keys, read in one place: `parse_key("step/3/grad/layers/0/kernel")` is
`TraceKey(kind="grad", step=3, name="layers/0/kernel")` (the format: docs/TRACE.md, jaxdp/core/traces/tracefile.py).

    init/<name>                  kind init,   step None (before the first step)
    state/<name>                 kind state,  step None
    step/<k>/loss, /x, /y        kind loss, x or y, step k, name ''
    step/<k>/<kind>/<name>       kind grad, param, state or spread, step k
    update/<k>/<name>            kind update, step k (`trace.updates`: param_k - param_(k-1), derived, never stored)

A name is everything after its prefix, '/' and dots included (`layers/0/kernel`, `h.0.attn/bias`). Any
other string (`meta`, a user's own key, `step/x/loss`, `step/3/grad/` without a name) is outside the
format: `parse_key` returns None and the caller says so."""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

WHOLE_STEP = ("loss", "x", "y")  # one array per step, no tensor name
PER_TENSOR = ("grad", "param", "state", "spread")  # step/<k>/<kind>/<name>
INITIAL = ("init", "state")  # <kind>/<name>, the values before the first step


class TraceKey(NamedTuple):
    """One trace key, parsed: what it holds (`kind`), at which step (None: before the first), of which tensor."""
    kind: str
    step: int | None
    name: str = ""

    @property
    def field(self) -> str:
        """The field `trace.diff` reports it under (`tracefile.FIELDS`): `init` for the values before the first
        step (`init/` and `state/`), else its kind."""
        return "init" if self.step is None else self.kind

    def key(self) -> str:
        """The key's string again (`parse_key`'s inverse, the step written without leading zeros)."""
        if self.step is None:
            return f"{self.kind}/{self.name}"
        if self.kind == "update":
            return f"update/{self.step}/{self.name}"
        return f"step/{self.step}/{self.kind}" + (f"/{self.name}" if self.name else "")


@lru_cache(maxsize=1 << 16)  # the judge parses each key of a trace many times (about 9,000 calls a comparison)
def parse_key(key: str) -> TraceKey | None:
    """`key` as a `TraceKey`, or None when it is outside the trace format (module docstring)."""
    head, _, rest = key.partition("/")
    if head in INITIAL:
        return TraceKey(head, None, rest) if rest else None
    if head not in ("step", "update"):
        return None
    step, _, rest = rest.partition("/")
    if not (step.isascii() and step.isdigit()):
        return None
    if head == "update":
        return TraceKey("update", int(step), rest) if rest else None
    kind, slash, name = rest.partition("/")
    if kind in WHOLE_STEP:
        return None if slash else TraceKey(kind, int(step))
    return TraceKey(kind, int(step), name) if kind in PER_TENSOR and name else None
