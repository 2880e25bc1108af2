"""Reading a compiled (post-optimisation) HLO module's text: every collective, in program order, with
the number of times it runs per step.

A collective inside a while loop's body runs once per iteration: XLA writes the loop's trip count
into the while's `backend_config` (`"known_trip_count":{"n":"K"}`, from its while-loop analysis),
and loops nest, so a collective's `trips` is the product of the trip counts of the loops around it.
The scheduled entry computation lists instructions in the order they run; a called computation's
collectives are listed where the call is.
"""
from __future__ import annotations

import math
import re

import numpy as np

from . import widened

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
               "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
OPS = ("all-reduce", "reduce-scatter", "all-gather", "collective-permute", "all-to-all")
REDUCTIONS = ("all-reduce", "reduce-scatter")

_HEADER = re.compile(r"^(?:ENTRY )?%(?P<name>[^\s(]+) .*\{\s*$")
_OP = re.compile(r"=\s*(?P<shape>.+?)\s+(?P<op>" + "|".join(OPS) + r")(?P<start>-start)?\(")
_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128)\[([\d,]*)\]")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
# computations an instruction runs, and how often relative to it (a loop body: trip-count times)
CALLS = re.compile(r"\b(condition|body|calls|branch_computations|true_computation|false_computation)="
                    r"(\{[^}]*\}|%[^\s,)]+)")


def computations(hlo_text: str) -> tuple[str, dict[str, list[str]]]:
    """(the entry computation's name, {computation name: its instruction lines})."""
    comps, entry, current = {}, None, None
    for line in hlo_text.splitlines():
        m = _HEADER.match(line)
        if m and not line.startswith(" "):
            current = m.group("name")
            comps[current] = []
            if line.startswith("ENTRY"):
                entry = current
        elif current is not None and line.strip() == "}":
            current = None
        elif current is not None:
            comps[current].append(line)
    if entry is None:
        raise ValueError("no ENTRY computation in this HLO text")
    return entry, comps


def trip_count(line: str) -> int | None:
    """A while instruction's known trip count, or None where XLA could not derive it."""
    m = _TRIP.search(line)
    return int(m.group(1)) if m else None


BRANCHES = ("branch_computations", "true_computation", "false_computation")  # a conditional's: one runs, or none


def _callees(line: str) -> list[tuple[str, int | None, bool]]:
    """(computation, runs per run of `line`, whether it is a conditional's branch) for each computation `line`
    calls (reductions' `to_apply` regions hold no collectives and are skipped)."""
    if re.search(r"\basync-(done|update)\(", line):  # the async-start lists the same computation
        return []
    out = []
    trips = trip_count(line) if " while(" in line else 1
    for attr, value in CALLS.findall(line):
        factor = trips if attr == "body" else (None if trips is None else trips + 1) if attr == "condition" else 1
        out += [(name, factor, attr in BRANCHES) for name in re.findall(r"%([^\s,}]+)", value)]
    return out


def arrays_of(shape_text: str) -> list[tuple[str, int]]:
    return [(d, math.prod(int(x) for x in dims.split(",") if x)) for d, dims in _ARRAY.findall(shape_text)]


def _top_level(shape_text: str) -> list[str]:
    """The elements of a tuple shape's outer level (`((a, b), (c, d))` -> `(a, b)`, `(c, d)`; `(a, c)` -> a, c)."""
    text = shape_text.strip()
    if not text.startswith("("):
        return [text]
    parts, depth, start = [], 0, 1
    for i, ch in enumerate(text):  # dims [a,b] and layouts {1,0} hold commas too: they nest like parentheses
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
        if (ch == "," and depth == 1) or (ch == ")" and depth == 0):
            parts.append(text[start:i])
            start = i + 1
    return parts


def _groups(line: str, n_devices: int) -> list[list[int]]:
    """The device groups of a collective's `replica_groups`: explicit (`{{0,1},{2,3}}`), iota
    (`[G,S]<=[dims]T(perm)`: arange(prod(dims)) reshaped to dims, transposed by perm, read as G rows of
    S), over mesh axes (`mesh['axis_0'=2,'axis_1'=2] {'axis_0'}`, an explicit-axes mesh's: a group per
    combination of the other axes, along the named ones), or empty / absent (one group of every device)."""
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if m:
        axes = re.findall(r"'([^']+)'=(\d+)", m.group(1))
        over = set(re.findall(r"'([^']+)'", m.group(2)))
        dims = [int(size) for _, size in axes]
        along = [i for i, (name, _) in enumerate(axes) if name in over]
        order = [i for i in range(len(axes)) if i not in along] + along
        return np.arange(math.prod(dims)).reshape(dims).transpose(order).reshape(
            -1, math.prod(dims[i] for i in along)).tolist()
    m = re.search(r"replica_groups=\{(\{[\d,]*\}(?:,\{[\d,]*\})*)\}", line)
    if m:
        return [[int(d) for d in g.split(",") if d] for g in re.findall(r"\{([\d,]*)\}", m.group(1))]
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
    if m:
        dims = [int(d) for d in m.group(3).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if m.group(4):
            ids = ids.transpose([int(d) for d in m.group(4).split(",")])
        return ids.reshape(int(m.group(1)), int(m.group(2))).tolist()
    return [list(range(n_devices))]


def _components(pairs: list[tuple[int, int]]) -> list[list[int]]:
    """A collective-permute's groups: the devices its (source, target) pairs connect (a ring's cycle)."""
    owner: dict[int, set] = {}
    for s, t in pairs:
        merged = owner.get(s, {s}) | owner.get(t, {t})
        for d in merged:
            owner[d] = merged
    return [list(g) for g in sorted({tuple(sorted(g)) for g in owner.values()})]


def _pairs(line: str) -> list[tuple[int, int]]:
    if "source_target_pairs=" not in line:
        return []
    return [(int(s), int(t)) for s, t in re.findall(r"\{(\d+),(\d+)\}", line.split("source_target_pairs=")[1])]


def collective(line: str, n_devices: int) -> dict | None:
    """The collective `line` issues (None if it issues none): op, `array_dtypes` (its result's arrays'
    element types, a tuple's in order), `dtype` (each type once, joined: "f32+bf16"), `widened` (0 here:
    `collectives_in_order` counts the arrays XLA:CPU reduced widened from bf16, `widened.py`), elements and
    bytes of its result, `groups` (the device groups it runs over: its replica_groups; for
    collective-permute the devices its pairs connect), `group` (the largest group's size), and for
    collective-permute its pairs."""
    m = _OP.search(line)
    if not m or "-done" in line.split("=")[0]:
        return None
    op = m.group("op")
    pairs = _pairs(line) if op == "collective-permute" else None
    groups = _components(pairs) if pairs is not None else _groups(line, n_devices)
    arrays = arrays_of(m.group("shape"))
    if m.group("start") and op != "all-reduce":  # async *-start returns (operands, results): the results
        arrays = arrays_of(_top_level(m.group("shape"))[-1])
    kinds = [d for d, _ in arrays]
    return {"op": op, "name": line.split("=")[0].strip().lstrip("%"), "arrays": len(arrays), "array_dtypes": kinds,
            "dtype": "+".join(dict.fromkeys(kinds)), "widened": 0, "tuple": m.group("shape").startswith("("),
            "async": bool(m.group("start")),
            "elements": sum(e for _, e in arrays),
            "bytes": sum(DTYPE_BYTES[d] * e for d, e in arrays),
            "group": max(map(len, groups), default=1), "groups": groups, "pairs": pairs}


def read_widened(c: dict, lines: list[str], comps: dict) -> dict:
    """Collective `c` of computation `lines` with the arrays XLA:CPU reduced widened from bf16 read back
    (`widened.narrowed_arrays`): `widened` their count, each one's type in `dtype` "bf16>f32"."""
    if c["op"] not in REDUCTIONS or "f32" not in c["array_dtypes"] or c["async"]:
        return c
    narrowed = widened.narrowed_arrays(c["name"], c["arrays"], c["tuple"], lines, comps)
    kinds = ["bf16>f32" if n and d == "f32" else d for d, n in zip(c["array_dtypes"], narrowed, strict=True)]
    return {**c, "widened": kinds.count("bf16>f32"), "dtype": "+".join(dict.fromkeys(kinds))}


def collectives_in_order(hlo_text: str, n_devices: int) -> list[dict]:
    """Every collective of the module in program order (`collective`, `read_widened`), each with `trips`:
    the times it runs per step (the product of the trip counts of the loops around it; None if one is
    unknown), and `branch`: whether it lies in a conditional's branch (it runs on the steps that take it)."""
    entry, comps = computations(hlo_text)
    found = []

    def walk(name: str, trips: int | None, depth: int, branch: bool) -> None:
        if depth > 64:
            raise ValueError(f"HLO call graph deeper than 64 at {name}")
        for line in comps.get(name, []):
            c = collective(line, n_devices)
            if c is not None:
                found.append({**read_widened(c, comps[name], comps), "trips": trips, "branch": branch})
            for callee, factor, in_branch in _callees(line):
                runs = None if trips is None or factor is None else trips * factor
                walk(callee, runs, depth + 1, branch or in_branch)

    walk(entry, 1, 0, False)
    return found
