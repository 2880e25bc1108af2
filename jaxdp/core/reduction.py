"""The reduction modes' names and canonical's shard count, without JAX (the configuration and the torch
twin read them): `jaxdp.canonical` is the JAX implementation, docs/CANONICAL.md the definition."""
from __future__ import annotations

from .errors import ConfigError

BLOCKS = 64          # the most shards (and devices) canonical supports; also the norm's block count
MIN_SHARD_ROWS = 4   # the default S keeps shards at least this many rows
REDUCTIONS = ("native", "canonical")


def default_shards(micro_rows: int) -> int:
    """The largest power of two dividing the micro-batch's rows that keeps shards >= MIN_SHARD_ROWS
    rows, at most BLOCKS (1 when the micro-batch has fewer than 2 x MIN_SHARD_ROWS rows)."""
    s = 1
    while s * 2 <= BLOCKS and micro_rows % (s * 2) == 0 and micro_rows // (s * 2) >= MIN_SHARD_ROWS:
        s *= 2
    return s


def resolve_shards(shards: int | None, micro_rows: int, n: int) -> int:
    """S for a micro-batch of `micro_rows` rows on `n` devices; a bad one is one line naming the fix."""
    s = default_shards(micro_rows) if not shards else shards
    if s & (s - 1) or not 1 <= s <= BLOCKS:
        raise ConfigError(f"shards={s}: canonical reduction needs a power of two from 1 to {BLOCKS}")
    if micro_rows % s:
        raise ConfigError(f"a micro-batch of {micro_rows} rows does not cut into shards={s}; give a power "
                          f"of two dividing it, e.g. shards={default_shards(micro_rows)}")
    if s % n:
        raise ConfigError(f"canonical reduction on {n} devices needs n to divide shards={s}: use a power of two "
                          f"number of devices up to {s}, or more shards (a bigger batch, or shards=)")
    return s
