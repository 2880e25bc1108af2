"""Canonical's and native's step temporaries (`memory_analysis()`) on the bench's mlp, for
tests/jaxdp/canonical/test_memory.py: compiled in a process started for canonical (fused multiply-adds
off before JAX starts, which the test session's process is not).

    python -m tests.canonical_memory STRATEGY[@S][:old|:inline] ...

Prints one JSON line per argument: {"strategy", "shards", "old", "native", "canonical"} (bytes), and
"entry_copies": the canonical program's copies of a parameter at its entry (`copy(%param...)`: XLA's
copies of donated arrays). `:old` compiles canonical as it was before issue 40's part 4 (every leaf
packed, the exchange in one piece, the update inline): the broken run the bound must catch; `:inline`
only the update inline (`common.update_apart` off): the broken run the copies' check must catch.
`@16`: 16 rows a shard.
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
    from jaxdp.core.run.config import RunConfig
    from jaxdp.harness.bench import reduction
    from jaxdp.strategies import common
    from jaxdp.strategies.zero import step

    mlp = RunConfig(optimizer="adamw", dtype="float32", platform="cpu", seed=0, lr=1e-3, model="mlp",
                    data="synthetic", hidden=(1024, 1024), batch_size=256)  # item 9's mlp: default S = 4
    now = reduce.ALONE_BYTES, reduce.PIECES, common.update_apart

    def inline(update, current, loss, apart):
        return update()
    for arg in argv:
        name, _, mode = arg.partition(":")
        strategy, _, shards = name.partition("@")
        native, canonical = reduction.configs(mlp.replace(shards=int(shards or 0)), strategy, None, N,
                                              ("native", "canonical"))
        reduce.ALONE_BYTES, reduce.PIECES = (float("inf"), 1) if mode == "old" else now[:2]
        common.update_apart = step.update_apart = inline if mode in ("old", "inline") else now[2]
        programs = [accounting.compile_step(c).program for c in (native, canonical)]
        temps = [accounting.step_memory(p)["temp_bytes"] for p in programs]
        text = programs[1].as_text()
        row = {"strategy": strategy, "shards": canonical.shards, "old": mode == "old",
               "native": temps[0], "canonical": temps[1],
               "entry_copies": text[text.index("ENTRY"):].count(" copy(%param")}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
