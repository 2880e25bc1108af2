"""Which arrays of a reduction XLA:CPU runs widened: the bf16 part of an all-reduce or reduce-scatter.

XLA:CPU has no 16-bit reduction: its AllReducePromotion (xla/service/all_reduce_promotion.cc) rewrites a
bf16 all-reduce as convert to f32 -> f32 all-reduce -> convert back to bf16, and its combiner may then
merge it into a tuple with the f32 ones (keeping the first one's reduction computation, so the pass's
`*_promoted` name can be lost). The compiled program's own types then read f32 everywhere, while the
partitioned program reduced in bf16. What is left to read is the convert back: a reduced array whose value
is narrowed to bf16 as soon as it is read (by a convert, or by the fusion it feeds, through layout-only
instructions) was reduced at bf16 precision. An honest fp32 reduction of values each device computed in
bf16 is not: its result is used in f32 (by the optimizer). A GPU reduces bf16 in bf16: its types say so.
"""
from __future__ import annotations

import re

_DEF = re.compile(r"^\s*(?:ROOT )?%(?P<name>[^\s=]+) = ")
_NARROW = re.compile(r"= bf16\[[^\]]*\]\S* convert\(%(?P<of>[^\s,)]+)\)")
_GTE = re.compile(r" get-tuple-element\(%(?P<of>[^\s,)]+)\), index=(?P<i>\d+)")
_LAYOUT = re.compile(r" (?:bitcast|copy|reshape)\(%(?P<of>[^\s,)]+)\)")
_OPERAND = re.compile(r"%([^\s,)]+)")
_FUSION = re.compile(r" fusion\((?P<args>[^)]*)\).*?calls=%(?P<body>[^\s,]+)")


def narrowed_arrays(name: str, count: int, tuple_shaped: bool, lines: list[str], comps: dict) -> list[bool]:
    """For each of the `count` arrays that instruction `name` (of computation `lines`) returns: whether its
    value is converted to bf16 as soon as it is read (`comps`: every computation's lines, for fusions)."""
    users = readers(lines)
    if not tuple_shaped:
        return [_narrowed(name, users, comps, 3)]
    out = [False] * count
    for line in users.get(name, []):
        m, d = _GTE.search(line), _DEF.match(line)
        if m and d and m.group("of") == name and int(m.group("i")) < count:
            out[int(m.group("i"))] |= _narrowed(d.group("name"), users, comps, 3)
    return out


def readers(lines: list[str]) -> dict[str, list[str]]:
    """{value: the instruction lines of `lines` that read it (name it among their operands)}."""
    out: dict[str, list[str]] = {}
    for line in lines:
        if (d := _DEF.match(line)) is None:
            continue
        for used in dict.fromkeys(_OPERAND.findall(line.split(" = ", 1)[1])):
            if used != d.group("name"):
                out.setdefault(used, []).append(line)
    return out


def _narrowed(value: str, users: dict, comps: dict, depth: int) -> bool:
    """Whether some reader of `value` (`users`: `readers` of its computation) converts it to bf16 (or passes
    it, through a bitcast, copy or reshape, or as a fusion's parameter, to one that does), `depth` such steps
    at most."""
    for line in users.get(value, []):
        d = _DEF.match(line)
        if (m := _NARROW.search(line)) and m.group("of") == value:
            return True
        if depth and (m := _LAYOUT.search(line)) and m.group("of") == value:
            if _narrowed(d.group("name"), users, comps, depth - 1):
                return True
        if depth and (m := _FUSION.search(line)):
            body = comps.get(m.group("body"), [])
            for k, arg in enumerate(_OPERAND.findall(m.group("args"))):
                param = next((p.group("name") for b in body if f" parameter({k})" in b and (p := _DEF.match(b))), None)
                if arg == value and param and _narrowed(param, readers(body), comps, depth - 1):
                    return True
    return False
