"""The reduction modes' names and canonical's shard count, without JAX (the configuration and the torch
twin read them): `jaxdp.canonical` is the JAX implementation, docs/CANONICAL.md the definition."""
from __future__ import annotations

from ..errors import ConfigError

BLOCKS = 64          # the most shards (and devices) canonical supports; also the norm's block count
MIN_SHARD_ROWS = 64  # the default S keeps shards at least this many rows...
MIN_SHARD_TOKENS = 512  # ...or at least this many tokens (rows x tokens per row, for a token model): at 256,
# torch_ref's gpt paid eager PyTorch's fixed cost per shard (1.06-1.55x native; docs/CANONICAL.md)
REDUCTIONS = ("native", "canonical")


def row_tokens(shape, integer: bool) -> int:
    """Tokens per row of a batch `x`: its row length when x holds token ids (integers), else 1."""
    count = 1
    for d in shape[1:]:
        count *= int(d)
    return count if integer else 1


def default_shards(micro_rows: int, tokens_per_row: int = 1) -> int:
    """The default S: the largest power of two dividing the micro-batch's rows, at most BLOCKS, that
    keeps each shard at least MIN_SHARD_ROWS rows or MIN_SHARD_TOKENS tokens (1 when no S > 1 does).
    Per device, canonical runs one shard after another, each with a fixed overhead: the work per shard,
    not the number of devices, sets its cost. S is the largest N a run can be compared across."""
    def enough(rows):
        return rows >= MIN_SHARD_ROWS or rows * tokens_per_row >= MIN_SHARD_TOKENS
    s = 1
    while s * 2 <= BLOCKS and micro_rows % (s * 2) == 0 and enough(micro_rows // (s * 2)):
        s *= 2
    return s


def resolve_shards(shards: int | None, micro_rows: int, n: int, tokens_per_row: int = 1) -> int:
    """S for a micro-batch of `micro_rows` rows on `n` devices; a bad one is one line naming the fix."""
    s = default_shards(micro_rows, tokens_per_row) if not shards else shards
    if s & (s - 1) or not 1 <= s <= BLOCKS:
        raise ConfigError(f"shards={s}: canonical reduction needs a power of two from 1 to {BLOCKS}")
    if micro_rows % s:
        raise ConfigError(f"a micro-batch of {micro_rows} rows does not cut into shards={s}; give a power "
                          f"of two dividing it, e.g. shards={default_shards(micro_rows, tokens_per_row)}")
    if s % n:
        raise ConfigError(f"canonical reduction on {n} devices needs n to divide shards={s}"
                          + ("" if shards else f" (the default for a micro-batch of {micro_rows} rows)") + ": "
                          + shards_fix(n))
    return s


def shards_fix(n: int) -> str:
    """What to give when N devices do not divide S: --shards N (S fixes the order of the sum, so the run it is
    compared with, on 1 device, needs the same --shards), or N devices canonical cannot run on."""
    if n > BLOCKS or n & (n - 1):
        return (f"canonical runs on a power of two number of devices up to {BLOCKS} (N divides S, a power of two); "
                f"use --devices {min(BLOCKS, 1 << (n.bit_length() - 1))}")
    return (f"give --shards {n} (shards={n}), and the same --shards {n} to the 1-device run it is compared with "
            f"(S fixes the order of the sum: docs/CANONICAL.md)")
