"""Issue 40, part 4: canonical's step temporaries at most 2x native's per device, read from the compiled
programs (`memory_analysis()`) of the bench's mlp (1024 x 1024, batch 256, AdamW) at N = 4 and the
default S (4), for the strategies whose all-reduce was over it: ddp-ring (the most: 1.89x) and ddp-bucket
(1.02x). The bound is the issue's; the smallest regression it catches is the one it was set against:
canonical's all-reduce as it was (every leaf copied into one packed vector, the whole [N, L] all-to-all
received at once, the update inline), 2.10x on ddp-ring (on ddp 1.13x since the simplifier is on: 2.25x
before, docs/CANONICAL.md, "The simplifier on"). The programs compile in a child process started for
canonical (tests/canonical_memory.py), about 15 s.

At S = 16 (16 rows a shard, the bench's "mlp S=16" row) ddp's temporaries are within 2x too (1.51x).

And no copy of a donated array at the step's entry, for ddp and zero2 (`common.update_apart`: with the
update inline, XLA copies donated state at the entry, caught: 1 copy on ddp, 3 on zero2; 19 on ddp while
canonical compiled with the simplifier off).
"""
from __future__ import annotations

import json
import subprocess
import sys

from tests import REPO

BOUND = 2.0


def test_canonical_temporaries_within_twice_natives_and_the_old_all_reduce_is_caught():
    cmd = [sys.executable, "-m", "tests.canonical_memory", "ddp-ring", "ddp-bucket", "ddp-ring:old", "ddp@16", "ddp",
           "zero2", "ddp:inline", "zero2:inline"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [(r["strategy"], r["shards"], r["old"]) for r in rows] == [
        ("ddp-ring", 0, False), ("ddp-bucket", 0, False), ("ddp-ring", 0, True), ("ddp", 16, False),
        ("ddp", 0, False), ("zero2", 0, False), ("ddp", 0, False), ("zero2", 0, False)]
    for r in rows[:4]:
        ratio = r["canonical"] / r["native"]
        assert r["native"] > 0 and (ratio > BOUND if r["old"] else ratio <= BOUND), r
    assert [r["entry_copies"] for r in rows[4:6]] == [0, 0], rows[4:6]
    assert all(r["entry_copies"] >= 1 for r in rows[6:]), rows[6:]  # the update inline: donated state copied
