"""canonical's default shard count (jaxdp/core/run/reduction.py, one rule for both frameworks): the largest
power of two dividing the micro-batch, at most 64, keeping >= 64 rows or >= 512 tokens per shard; a
bad S or an N that does not divide it is one line naming the fix."""
from __future__ import annotations

import re

import numpy as np
import pytest

from jaxdp.core.errors import ConfigError
from jaxdp.core.run.reduction import default_shards, resolve_shards, row_tokens


def test_default_shards_keep_64_rows_or_512_tokens_per_shard():
    assert [default_shards(r) for r in (1, 8, 48, 127, 128, 256, 512, 4096, 8192)] == [1, 1, 1, 1, 2, 4, 8, 64, 64]
    # token rows: 64 tokens per row need 8 rows per shard; 1024 need 1
    assert [default_shards(r, 64) for r in (8, 16, 32, 24)] == [1, 2, 4, 2]
    assert default_shards(16, 1024) == 16 and default_shards(256, 1024) == 64
    for rows, tokens in ((256, 1), (32, 64), (96, 16)):
        s = default_shards(rows, tokens)
        assert rows % s == 0 and (rows // s >= 64 or rows // s * tokens >= 512)
        assert s == 64 or rows % (2 * s) or (rows // (2 * s) < 64 and rows // (2 * s) * tokens < 512)


def test_row_tokens_counts_token_ids_only():
    assert row_tokens((32, 64), integer=True) == 64 and row_tokens((32, 784), integer=False) == 1
    assert row_tokens(np.zeros((4, 8), np.int32).shape, np.issubdtype(np.int32, np.integer)) == 8


@pytest.mark.parametrize("args, message", [
    ((0, 256, 8), "on 8 devices needs n to divide shards=4"),  # the default (4) refused at N = 8
    # the value to give, and that the 1-device run it is compared with needs the same (was "up to 1")
    ((0, 64, 2), re.escape("shards=1 (the default for a micro-batch of 64 rows): give --shards 2 (shards=2), and "
                           "the same --shards 2 to the 1-device run it is compared with")),
    ((0, 48, 3), "canonical runs on a power of two number of devices up to 64 .*; use --devices 2"),
    ((2, 256, 4), "on 4 devices needs n to divide shards=2: give --shards 4"),
    ((3, 256, 1), "shards=3: canonical reduction needs a power of two"),
    ((8, 12, 1), "a micro-batch of 12 rows does not cut into shards=8"),
])
def test_a_bad_shard_count_is_one_line(args, message):
    with pytest.raises(ConfigError, match=message) as err:
        resolve_shards(*args)
    assert "\n" not in str(err.value)
