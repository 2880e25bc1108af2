"""A resumed trace (meta `first_step` > 1: a run restarted from a checkpoint) against the full run, or
two runs resumed at different steps: judged over the steps both hold. The trace that starts earlier is
cut to the later start; its parameters (and state) after the step before stand for its initial values,
so the judge's `init` check asks that the resumed run started from the same bits, and every shared step
is judged as usual (`jaxdp diff`'s note says which steps)."""
from __future__ import annotations

from ..core.traces.trace import Trace, TraceError, parse_key


def align(a: Trace, b: Trace, sides=("A", "B")) -> tuple[Trace, Trace, str]:
    """(a, b, note): both starting at the later first step; note '' when they already did."""
    if a.first_step == b.first_step:
        return a, b, ""
    late = max(a.first_step, b.first_step)
    early, early_side, late_side = (a, sides[0], sides[1]) if a.first_step < b.first_step else (b, sides[1], sides[0])
    last = min(a.steps, b.steps)
    if early.steps < late or last < late:
        raise TraceError(f"no step in common: {sides[0]} holds steps {a.first_step}..{a.steps}, {sides[1]} "
                         f"{b.first_step}..{b.steps}; compare a resumed trace with a run that reaches its steps")
    cut = _cut(early, late)
    note = (f"compared over steps {late}..{last}, the steps both traces hold: {late_side} starts at step {late} "
            f"(resumed); {early_side}'s steps {early.first_step}..{late - 1} are not compared, and its values after "
            f"step {late - 1} stand for its initial ones")
    return (cut, b, note) if early is a else (a, cut, note)


def _cut(t: Trace, late: int) -> Trace:
    """`t` from step `late` on: `init/` and `state/` its values after step late - 1 (kept as they are
    where that step lacks them, so that the judge names the key)."""
    before = late - 1
    arrays = {}
    for k, v in t.arrays.items():
        parsed = parse_key(k)
        if parsed is not None and parsed.step is not None and parsed.step < late:
            continue
        if parsed is not None and parsed.step is None:  # init/<name>, state/<name>
            field = "param" if parsed.kind == "init" else "state"
            v = t.arrays.get(f"step/{before}/{field}/{parsed.name}", v)
        arrays[k] = v
    return Trace({**t.meta, "first_step": late, "steps": t.steps}, arrays)
