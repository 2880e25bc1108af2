"""torch_ref's canonical all-reduce over the step's own partial sums (`canonical.reduce.all_reduce_`, what the
canonical steps of single, ddp-naive, ddp-bucket and ddp-ring run): at N = 2 and 4, built-in and hand-written
collectives, vectors N divides and does not (padded within their own storage, or into a copy where a vector is a
view that does not end it), every element is the definition's
(the tree over the ranks' values, / S, / A) bit for bit, where a left fold over the ranks is not (N = 4). Its
temporaries: the storage's move where it grows (one vector, briefly two), then the all-to-all's receive buffer (the
tree added within it, freed before the all-gather) and this rank's chunk (gloo's all-gather holds one vector of its
own meanwhile): at most 1 + 1/N vectors above the partial sums, where padding the whole and copying the result back
held 2.5-2.75."""
from __future__ import annotations

import pytest

from tests.torch_helpers import world
from tests.torch_reduce_ranks import SIZES


@pytest.mark.torch_jobs(lambda p: [("canonical_reduce", p["n"])])
@pytest.mark.parametrize("n", [2, 4])
def test_all_reduce_over_the_partial_sums_is_the_definition(n):
    per_rank = world(n)["canonical_reduce"]
    assert len(per_rank) == n
    for rank, checks in enumerate(per_rank):
        for size in SIZES:
            checked = [checks[(check, size, ring)] for check in ("exact", "view") for ring in (False, True)]
            assert all(checked), (rank, size, checked)
            if n == 4:
                assert checks[("fold_differs", size, False)], (rank, size)
    peak, padded = per_rank[0][("peak", SIZES[3], False)], per_rank[0][("peak_padded", SIZES[3], False)]
    assert peak <= 1 + 1 / n + 0.01 and padded >= 2.0, (peak, padded)
