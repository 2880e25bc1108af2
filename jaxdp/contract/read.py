"""The collectives of a compiled JAX step as `Comm`s: op, dtype, elements, bytes, the mesh axis its replica
groups run over, runs per step (loops' trip counts: analysis/hlo.py), and whether compute is scheduled while it
is in flight (async start/done pairs with work between: analysis/schedule.py; XLA:CPU runs every collective
synchronously, so on the CPU `overlaps` is None, not False).

A replica group's members are the program's logical devices, numbered in the order of the mesh's devices:
member i sits at `np.unravel_index(i, mesh.devices.shape)`, and the axes along which a group's members differ
are the axes it runs over ("data", "replica+data"); a group of all devices of a one-axis mesh is that axis."""
from __future__ import annotations

import re

import numpy as np

from ..analysis import hlo, schedule, widened
from ..core.contract.report import Comm


def axis_of(groups: list[list[int]], shape: tuple[int, ...], names: tuple[str, ...]) -> str:
    """The mesh axes a collective's groups run over ('+'-joined), or 'devices i,j' where they are no axis."""
    if not groups or not groups[0] or len(groups[0]) == 1:
        return "none"
    size = int(np.prod(shape))
    if any(d >= size for g in groups for d in g):
        return "devices " + ",".join(map(str, groups[0]))
    coords = np.array([np.unravel_index(d, shape) for d in groups[0]])
    varying = [names[a] for a in range(len(shape)) if len(set(coords[:, a])) > 1]
    together = int(np.prod([shape[names.index(a)] for a in varying]))
    return "+".join(varying) if together == len(groups[0]) else "devices " + ",".join(map(str, groups[0]))


def _takes_a_slice(value: str, users: dict, depth: int = 2) -> bool:
    """Whether every reader of `value` takes this device's slice of it: it reads `partition-id` too (a
    dynamic-slice, or a fusion computing one), through get-tuple-element."""
    found = users.get(value, [])
    if not found:
        return False
    for line in found:
        name = line.split(" = ", 1)[0].strip().removeprefix("ROOT ").lstrip("%")
        if re.search(r"= \w+\[\] get-tuple-element\(", line):
            continue  # a scalar combined in (the loss): not a gradient
        if " get-tuple-element(" in line and depth:
            if not _takes_a_slice(name, users, depth - 1):
                return False
        elif not re.search(r"%partition-id[\w.]*\b", line.split(" = ", 1)[1]):
            return False
    return True


def sliced_all_reduces(hlo_text: str) -> set[str]:
    """The all-reduces each device reads only its own slice of: a reduce-scatter, as XLA:CPU runs one that
    its partitioner wrote as all-reduce + dynamic-slice (XLA:GPU's ReduceScatterCreator makes it one)."""
    _, comps = hlo.computations(hlo_text)
    out = set()
    for lines in comps.values():
        users = widened.readers(lines)
        for line in lines:
            m = re.match(r"^\s*(?:ROOT )?%(\S+) = .* all-reduce\(", line)
            if m and _takes_a_slice(m.group(1), users):
                out.add(m.group(1))
    return out


def comms(hlo_text: str, shape: tuple[int, ...], names: tuple[str, ...]) -> list[Comm]:
    """Every collective of the compiled module `hlo_text`, run on a mesh of `shape` with axes `names`."""
    n = int(np.prod(shape))
    found = hlo.collectives_in_order(hlo_text, n)
    timing = schedule.overlap(hlo_text)
    readable = any(c["async"] for c in found)
    sliced = sliced_all_reduces(hlo_text)
    out = []
    for c in found:
        full = c["elements"] * (c["group"] if c["op"] == "reduce-scatter" else 1)
        op, ran_as = ("reduce-scatter", "all-reduce") if c["name"] in sliced else (c["op"], "")
        itemsize = c["bytes"] // max(c["elements"], 1)
        info = timing.get(c["name"])
        overlaps = None if not readable else bool(info and info["async"] and info["overlap_ops"] > 0)
        out.append(Comm(op, c["dtype"], int(full), int(full * itemsize), axis_of(c["groups"], shape, names),
                        int(c["group"]), c["trips"], overlaps, ran_as, c["branch"]))
    return out
