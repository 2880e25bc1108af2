"""The HBM bytes one fused GPU kernel reads and writes: what `projection.hbm_bytes` charges a fusion.

Charging a fusion all of its operands overstates a kernel that reads a part of each. ddp-ring is the case
that showed it: XLA:GPU fuses the pack, the ring's chunk writes and the unpack into every kernel that reads
a gradient after the ring (each optimizer update, each finiteness check), so each such kernel takes every
gradient leaf and all N chunks as operands and reads one leaf's worth of them (docs/GPU.md). So the
elements each instruction of the fused computation must produce are propagated from the root back to the
parameters:
- the root: all its elements (a root `dynamic-update-slice` of a parameter is written in place: its update's
  elements, and nothing of that parameter read);
- `slice`, `dynamic-slice`, `gather`: their operand gives the elements demanded of them (each result element
  is one operand element), their indices in full;
- `dynamic-update-slice`, `concatenate`, `pad`: each result element comes from one operand, so the demand
  is split in proportion to each operand's share of the result (the offsets, often dynamic, are not read);
- `broadcast`: at most the operand's elements; anything else with matching sizes (elementwise, convert,
  bitcast, reshape, transpose, reduce over its operand): demand x operand elements / result elements;
- what reads its operands otherwise (`dot`, `convolution`, `scatter`, `sort`, a nested fusion, a call):
  the whole operands.
Demands are kept by which elements they ask for (`_Demand`): users asking for the same elements (a gradient
and its square, each sliced to one leaf) count once, users asking for different ones (two leaves) add up;
XLA's cloned copies of one instruction count once (`_unique`). A parameter is read min(its demand, its
elements) times its element's bytes: never more than the old count (every operand whole), the same for a
fusion that reads its operands whole, and for the ring's chunks an estimate (each chunk's share of the
vector; the chunks' offsets are known only at run time).
"""
from __future__ import annotations

import re

from . import hlo, schedule

WHOLE = ("dot", "convolution", "scatter", "sort", "fusion", "call", "custom-call", "while", "conditional",
         "select-and-scatter", "fft", "triangular-solve", "cholesky", "rng-bit-generator")
SLICES = ("slice", "dynamic-slice", "gather")
SELECTS = ("dynamic-update-slice", "concatenate", "pad")
_PARAM = re.compile(r"\bparameter\((\d+)\)")


def elements(shape: str) -> float:
    return float(sum(e for _, e in hlo.arrays_of(shape)))


def _bytes(shape: str) -> float:
    return float(sum(hlo.DTYPE_BYTES[d] * e for d, e in hlo.arrays_of(shape)))


def operands(line: str, op: str) -> list[str]:
    """The names of an instruction's operands, in order."""
    args = line.split(f" {op}(", 1)[1].split(")", 1)[0] if f" {op}(" in line else ""
    return re.findall(r"%([^\s,)]+)", args)


def _shares(op: str, demand: float, result: float, sizes: list[float]) -> list[float]:
    """The elements each operand must give for `demand` elements of a result of `result` elements."""
    if op in WHOLE:
        return sizes
    if op in SLICES:
        return [demand] + sizes[1:]
    if op == "dynamic-update-slice":  # the update's share, the rest from the operand; the offsets whole
        update = min(sizes[1], result)
        return [demand * (result - update) / result, demand * update / result] + sizes[2:]
    if op in SELECTS:  # concatenate: each operand its share; pad: the operand its share, the padding value
        data = sizes if op == "concatenate" else sizes[:1]
        return [demand * s / result for s in data] + sizes[len(data):]
    if op == "broadcast":
        return [min(demand, s) for s in sizes]
    return [demand * s / result for s in sizes]


def _unique(lines: list[str]) -> list[tuple[str, str, str, list[str], str, bool]]:
    """(name, shape, opcode, operands, attributes, is root) of each instruction, less the copies XLA's fusion cloned
    (the same opcode, shape, operands and attributes: the kernel reads what they read once), operands named by
    the kept copy."""
    kept, seen, out = {}, {}, []
    for name, shape, op, line in schedule.defs(lines):
        head, _, rest = line.partition(f" {op}(")
        args, _, attrs = rest.partition(")")
        args = re.sub(r"%([^\s,)]+)", lambda m: "%" + kept.get(m.group(1), m.group(1)), args)
        attrs = attrs.split(", metadata=", 1)[0]
        root = head.lstrip().startswith("ROOT ")
        if (shape, op, args, attrs) in seen and not root:
            kept[name] = seen[(shape, op, args, attrs)]
            continue
        seen[(shape, op, args, attrs)] = kept[name] = name
        out.append((name, shape, op, re.findall(r"%([^\s,)]+)", args), attrs, root))
    return out


class _Demand:
    """The elements demanded of each instruction, by which elements (a key: the chain of slices, updates and
    reshuffles they were reached through, interned): two users asking for the same elements (g and g * g both
    sliced to one leaf) count once, users asking for different ones (two leaves' slices) add up."""

    def __init__(self):
        self.by_name: dict[str, dict[int, float]] = {}
        self.keys: dict[tuple, int] = {("all",): 0}

    def add(self, name: str, key: int, count: float) -> None:
        wanted = self.by_name.setdefault(name, {})
        wanted[key] = max(wanted.get(key, 0.0), count)

    def key(self, op: str, attrs: str, index: int, parent: int) -> int:
        return self.keys.setdefault((op, attrs, index, parent), len(self.keys))

    def total(self, name: str) -> float:
        return sum(self.by_name.get(name, {}).values())


def _root_demand(defs, shapes: dict[str, str], params: dict[str, int]) -> tuple[_Demand, float]:
    """The demand at the root (a tuple root: each output whole; a dynamic-update-slice of a parameter is written
    in place: its update only, nothing of the parameter) and the bytes written."""
    by_name, demand, written = {d[0]: d for d in defs}, _Demand(), 0.0
    name, _, op, args, _, _ = next((d for d in defs if d[5]), defs[-1])
    for out in args if op == "tuple" else [name]:
        _, shape, out_op, out_args, _, _ = by_name.get(out, (out, "", "", [], "", False))
        if out_op == "dynamic-update-slice" and out_args[0] in params:
            for a in out_args[1:]:
                demand.add(a, 0, elements(shapes[a]))
            written += _bytes(shapes[out_args[1]])
            continue
        demand.add(out, 0, elements(shape))
        written += _bytes(shape)
    return demand, written


def _same_elements(op: str, index: int, size: float, result: float) -> bool:
    """Whether operand `index` of `op` is read at the result's own elements (the demand's key passes through)."""
    if op == "dynamic-update-slice":
        return index == 0
    return size == result and op not in WHOLE + SLICES + SELECTS + ("broadcast", "reduce")


def traffic(lines: list[str]) -> tuple[list[float], float]:
    """([bytes read of each parameter, by its number], bytes written) of a fused computation's lines."""
    defs = _unique(lines)
    shapes = {d[0]: d[1] for d in defs}
    params = {n: int(_PARAM.search(ln).group(1)) for n, _, op, ln in schedule.defs(lines) if op == "parameter"}
    demand, written = _root_demand(defs, shapes, params)
    for name, shape, op, args, attrs, _ in reversed(defs):
        result = elements(shape) or 1.0
        total = demand.total(name)
        if total <= 0 or op in ("parameter", "tuple"):
            continue
        names = [a for a in args if a in shapes]
        sizes = [elements(shapes[a]) for a in names]
        scale = min(1.0, result / total)  # never more than all of it, however many keys ask
        for key, count in demand.by_name[name].items():
            shares = _shares(op, count * scale, result, sizes)
            for i, (a, size, share) in enumerate(zip(names, sizes, shares, strict=True)):
                same = _same_elements(op, i, size, result)
                demand.add(a, key if same else demand.key(op, attrs, i, key), share)
    reads = [0.0] * (max(params.values()) + 1 if params else 0)
    for name, number in params.items():
        count = elements(shapes[name])
        reads[number] = min(demand.total(name), count) * (_bytes(shapes[name]) / count if count else 0.0)
    return reads, written
