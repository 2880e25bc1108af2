"""A pairwise covering set: every value of every dimension appears, and every pair of values of any
two dimensions meets in at least one case (greedy construction; deterministic)."""
from __future__ import annotations

import itertools


def pairwise(dims: dict[str, list]) -> list[dict]:
    names = list(dims)
    uncovered = {((a, va), (b, vb)) for a, b in itertools.combinations(names, 2)
                 for va in dims[a] for vb in dims[b]}
    cases = []
    while uncovered:
        best, best_gain = None, -1
        for values in itertools.product(*(dims[n] for n in names)):
            case = dict(zip(names, values, strict=False))
            gain = sum(((a, case[a]), (b, case[b])) in uncovered for a, b in itertools.combinations(names, 2))
            if gain > best_gain:
                best, best_gain = case, gain
        cases.append(best)
        uncovered -= {((a, best[a]), (b, best[b])) for a, b in itertools.combinations(names, 2)}
    return cases
