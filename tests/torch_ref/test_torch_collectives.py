"""The ring collectives (isend/irecv) equal the built-in ones, for N = 1..4 and sizes not divisible
by N. Sums are reordered, so float64 agrees to ~1e-16 relative; the test allows 1e-13. `reduce_to_root`
(canonical dp's sum on the server) is bitwise the canonical tree over the ranks."""
from __future__ import annotations

import pytest

from tests.torch_helpers import RING_SIZES, world


@pytest.mark.torch_jobs(lambda p: [("ring", p["n"])])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_ring_collectives_equal_the_built_ins(n):
    per_rank = world(n)["ring"]
    assert len(per_rank) == n
    for rank, errors in enumerate(per_rank):
        for (op, size), err in errors.items():
            if op in ("shapes", "root_tree"):
                assert err is True, (rank, size)
            else:
                assert err < 1e-13, (n, rank, op, size, err)
    assert {size for (_, size) in per_rank[0]} == set(RING_SIZES)
