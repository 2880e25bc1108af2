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
A parameter is read min(its total demand, its elements) times its element's bytes. Never more than the old
count (every operand in full), and the same for a fusion that reads its operands whole.
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


def _root_demand(defs, shapes: dict[str, str], params: dict[str, int]) -> tuple[dict[str, float], float]:
    """({instruction: elements demanded} at the root, bytes written): a tuple root demands each output whole;
    a dynamic-update-slice of a parameter is written in place (its update only)."""
    name, shape, op, line = next((d for d in defs if d[3].lstrip().startswith("ROOT ")), defs[-1])
    outputs = operands(line, op) if op == "tuple" else [name]
    demand, written = {}, 0.0
    for out in outputs:
        out_line = next((d for d in defs if d[0] == out), None)
        if out_line and out_line[2] == "dynamic-update-slice" and operands(out_line[3], out_line[2])[0] in params:
            update, *offsets = operands(out_line[3], out_line[2])[1:]
            for a in (update, *offsets):
                demand[a] = demand.get(a, 0.0) + elements(shapes[a])
            written += _bytes(shapes[update])
            continue
        demand[out] = demand.get(out, 0.0) + elements(shapes.get(out, ""))
        written += _bytes(shapes.get(out, ""))
    return demand, written


def traffic(lines: list[str]) -> tuple[list[float], float]:
    """([bytes read of each parameter, by its number], bytes written) of a fused computation's lines."""
    defs = schedule.defs(lines)
    shapes = {n: s for n, s, _, _ in defs}
    params = {n: int(_PARAM.search(ln).group(1)) for n, _, op, ln in defs if op == "parameter"}
    demand, written = _root_demand(defs, shapes, params)
    for name, shape, op, line in reversed(defs):
        wanted = min(demand.get(name, 0.0), elements(shape))
        if wanted <= 0 or op in ("parameter", "tuple"):
            continue
        names = [a for a in operands(line, op) if a in shapes]
        sizes = [elements(shapes[a]) for a in names]
        for a, share in zip(names, _shares(op, wanted, elements(shape) or 1.0, sizes), strict=True):
            demand[a] = demand.get(a, 0.0) + share
    reads = [0.0] * (max(params.values()) + 1 if params else 0)
    for name, number in params.items():
        shape = shapes[name]
        count = elements(shape)
        reads[number] = min(demand.get(name, 0.0), count) * (_bytes(shape) / count if count else 0.0)
    return reads, written
