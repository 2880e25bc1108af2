"""What a scheduled GPU program overlaps: each collective's start/done pair and the work between them.

XLA:GPU turns a collective into `<op>-start` and `<op>-done` (or `async-start` / `async-done` around a
computation holding it) and its latency-hiding scheduler moves independent instructions between the two:
those run while the collective is in flight. For each collective (by its start's name) `overlap` gives
`async` (a start/done pair that XLA did not mark `"is_sync":true`: a pair with nothing to hide behind is
run synchronously), `overlap_ops` (the instructions scheduled between start and done, less the free ones:
tuple plumbing, bitcasts, constants) and `overlap_flops` (their matrix-product FLOPs: 2 x the output's
elements x the contracted size of each `dot` they run, through fusions, calls and loops, a loop body
counted once per known trip). Elementwise work is not counted: the FLOPs are the tensor-core ones.
"""
from __future__ import annotations

import math
import re

from . import hlo

FREE = ("get-tuple-element", "bitcast", "tuple", "constant", "parameter", "copy-start", "copy-done")
_DEF = re.compile(r"^\s*(?:ROOT )?%(?P<name>[^\s=]+) = (?P<shape>.+?) (?P<op>[a-z][\w-]*)\(")
_DIMS = re.compile(r"\[([\d,]*)\]")
_ASYNC = re.compile(r"(?P<op>" + "|".join(hlo.OPS) + r"|async)-(?P<end>start|done)\((?P<args>[^)]*)\)")


def _dims(shape: str) -> list[int]:
    m = _DIMS.search(shape)
    return [int(d) for d in m.group(1).split(",") if d] if m else []


def defs(lines: list[str]) -> list[tuple[str, str, str, str]]:
    """(name, result shape, opcode, line) of each instruction, in schedule order."""
    out = []
    for line in lines:
        m = _DEF.match(line)
        if m:
            out.append((m.group("name"), m.group("shape"), m.group("op"), line))
    return out


def _dot_flops(line: str, shape: str, shapes: dict[str, str]) -> float:
    operands = re.findall(r"%([^\s,)]+)", line.split(" dot(", 1)[1].split(")", 1)[0])
    m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", line)
    lhs = _dims(shapes.get(operands[0], "")) if operands else []
    contracted = math.prod(lhs[int(c)] for c in m.group(1).split(",") if c) if m and lhs else 0
    return 2.0 * math.prod(_dims(shape)) * contracted


class Flops:
    """Matrix-product FLOPs of each computation of a module (memoised), callees included."""

    def __init__(self, comps: dict[str, list[str]]):
        self.comps, self.memo = comps, {}

    def of_computation(self, name: str, depth: int = 0) -> float:
        if name not in self.memo:
            found = defs(self.comps.get(name, []))
            shapes = {n: s for n, s, _, _ in found}
            self.memo[name] = 0.0  # a cycle (none in HLO) would count nothing
            self.memo[name] = sum(self.of_line(op, shape, line, shapes, depth) for _, shape, op, line in found)
        return self.memo[name]

    def of_line(self, op: str, shape: str, line: str, shapes: dict[str, str], depth: int = 0) -> float:
        if op == "dot":
            return _dot_flops(line, shape, shapes)
        if depth > 32 or op.endswith("-done") or op == "async-update":
            return 0.0
        total = 0.0
        trips = hlo.trip_count(line) if op == "while" else 1
        for attr, value in re.findall(r"\b(body|calls|branch_computations|to_apply)=(\{[^}]*\}|%[^\s,)]+)", line):
            if attr == "to_apply":
                continue
            factor = (trips or 1) if attr == "body" else 1
            total += factor * sum(self.of_computation(c, depth + 1) for c in re.findall(r"%([^\s,}]+)", value))
        return total


def _inner_collectives(line: str, comps: dict[str, list[str]]) -> list[str]:
    """The collectives an `async-start` wraps (the names of their instructions in its computation)."""
    names = []
    for value in re.findall(r"\bcalls=(%[^\s,)]+)", line):
        for inner in comps.get(value.lstrip("%"), []):
            m = _DEF.match(inner)
            if m and m.group("op") in hlo.OPS:
                names.append(m.group("name"))
    return names


def overlap(hlo_text: str) -> dict[str, dict]:
    """{a collective's start name (or the wrapped collective's name): {async, overlap_ops, overlap_flops}}."""
    _, comps = hlo.computations(hlo_text)
    flops, out = Flops(comps), {}
    for lines in comps.values():
        found = defs(lines)
        shapes = {n: s for n, s, _, _ in found}
        for i, (name, _, op, line) in enumerate(found):
            if not (op.endswith("-start") and (op[:-6] in hlo.OPS or op == "async-start")):
                continue
            keys = [name] if op != "async-start" else _inner_collectives(line, comps)
            if not keys:
                continue
            done = next((j for j in range(i + 1, len(found)) if found[j][2].endswith("-done")
                         and re.search(r"\(%" + re.escape(name) + r"\)", found[j][3])), None)
            between = found[i + 1:done] if done is not None else []
            work = [(o, s, ln) for _, s, o, ln in between if o not in FREE]
            info = {"async": done is not None and '"is_sync":true' not in line, "overlap_ops": len(work),
                    "overlap_flops": sum(flops.of_line(o, s, ln, shapes) for o, s, ln in work)}
            out.update({k: info for k in keys})
    return out


def total_flops(hlo_text: str) -> float:
    """The entry computation's matrix-product FLOPs (per device: the program is one device's)."""
    entry, comps = hlo.computations(hlo_text)
    return Flops(comps).of_computation(entry)
