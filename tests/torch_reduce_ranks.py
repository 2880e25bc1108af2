"""Rank side of tests/torch_ref/canonical/test_torch_reduce.py: torch_ref's canonical all-reduce written over the
step's own partial sums (`canonical.reduce.all_reduce_`) against the definition, in one world of n ranks."""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

# float64 elements: 2 and 4 divide 12, 100 and 2^17, neither 5 nor 2^17 + 3 (1 MiB + 24 B: the temporaries' case)
SIZES = (5, 12, 100, (1 << 17) + 3, 1 << 17)
SHARDS, ACCUM = 8, 3


def run(rank: int, n: int) -> dict:
    """{(check, size, ring): value}: `exact`, all_reduce_ == finish(tree over the ranks' vectors), bitwise;
    `fold_differs`, a left fold over the ranks is not that (the data tell the orders apart; N >= 4);
    `view`, the same on a view that does not end its storage (padded into a copy); `peak`, the most all_reduce_'s
    allocations rose, in vectors (rank 0's; the largest size N does not divide), and `peak_padded`, the same for
    the whole padded and copied back (the form before it)."""
    from torch_ref.canonical import reduce as C

    out = {}
    for size in SIZES:
        x = torch.from_numpy(np.random.default_rng([rank, size]).standard_normal(size))
        rows = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(rows, x)
        want = C.finish(C.tree(torch.stack(rows)), SHARDS, ACCUM)
        fold = rows[0]
        for r in rows[1:]:
            fold = fold + r
        for ring in (False, True):
            out[("exact", size, ring)] = bool(torch.equal(C.all_reduce_(x.clone(), SHARDS, ACCUM, ring), want))
            spare = torch.cat([x, x[:1]])
            out[("view", size, ring)] = bool(torch.equal(C.all_reduce_(spare[:size], SHARDS, ACCUM, ring), want))
        out[("fold_differs", size, False)] = not torch.equal(C.finish(fold, SHARDS, ACCUM), want)
    big = torch.from_numpy(np.random.default_rng(rank).standard_normal(SIZES[3]))
    for name, reduce in (("peak", lambda v: C.all_reduce_(v, SHARDS, ACCUM)),
                         ("peak_padded", lambda v: v.copy_(C.finish_(C.all_reduce(v), SHARDS, ACCUM)))):
        out[(name, SIZES[3], False)] = _peak(reduce, big) / big.nbytes - 1
    return out


def _peak(reduce, source: torch.Tensor) -> int:
    """The most allocations rose while `reduce` ran on a copy of `source` made in the profiled region (the
    profiler sees a block freed only if it saw it allocated: a storage grown is a block moved), that copy
    included."""
    from torch.profiler import ProfilerActivity, profile

    from torch_ref.analysis.accounting import peak_rise

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        reduce(source.clone())
    return peak_rise(prof)
