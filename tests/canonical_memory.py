"""Canonical's and native's step temporaries (`memory_analysis()`) on the bench's mlp, for
tests/jaxdp/canonical/test_memory.py: compiled in a process started for canonical (fused multiply-adds
off before JAX starts, which the test session's process is not).

    python -m tests.canonical_memory STRATEGY[:old] ...

Prints one JSON line per argument: {"strategy", "old", "native", "canonical"} (bytes). `:old` compiles
canonical as it was before issue 40's part 4 (every leaf packed, the exchange in one piece): the
broken run the test must catch.
"""
from __future__ import annotations

import json
import sys

N = 4


def main(argv) -> None:
    from jaxdp import devices

    devices.setup(N, "cpu", reduction="canonical")
    from jaxdp.analysis import accounting
    from jaxdp.canonical import reduce
    from jaxdp.core.config import RunConfig
    from jaxdp.harness.bench import reduction

    mlp = RunConfig(optimizer="adamw", dtype="float32", platform="cpu", seed=0, lr=1e-3, model="mlp",
                    data="synthetic", hidden=(1024, 1024), batch_size=256)  # item 9's mlp: default S = 4
    now = reduce.ALONE_BYTES, reduce.PIECES
    for arg in argv:
        strategy, _, old = arg.partition(":")
        native, canonical = reduction.configs(mlp, strategy, None, N, ("native", "canonical"))
        reduce.ALONE_BYTES, reduce.PIECES = (float("inf"), 1) if old else now
        temps = [accounting.step_memory(accounting.compile_step(c).program)["temp_bytes"] for c in (native, canonical)]
        row = {"strategy": strategy, "old": bool(old), "native": temps[0], "canonical": temps[1]}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
