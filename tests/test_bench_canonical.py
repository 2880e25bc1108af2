"""`jaxdp bench` item 9 (`--reduction canonical` against `native`), in --quick: the rows exist, the
bytes and temporaries read from the compiled programs are positive, and canonical sends what the
theory says. No time is asserted (no benchmark lives in the test suite).

Theory: canonical's all-reduce is an all-to-all of each device's partial sums plus an all-gather of
the chunk it reduced, (N-1)/N B each: 2(N-1)/N B, the bytes of psum's ring all-reduce. Measured (tiny
mlp, N = 2): ddp sends 4 bytes more than native (the loss, in canonical's own all-to-all and
all-gather: native folds it into the gradient's all-reduce), zero1 about 7% more (the canonical
layout pads every parameter's flat shard to a multiple of 64 blocks, `reduction.BLOCKS`).

The measurement runs in a child process started with XLA_FLAGS=--xla_cpu_max_isa=AVX (canonical
needs it before JAX starts; this test session's process has JAX up without it), shared by the tests.
"""
from __future__ import annotations

import math

import pytest

from jaxdp.bench import reduction
from jaxdp.bench.markdown import reduction_section
from jaxdp.bench.plan import plan

# canonical / native bytes per step: at least 1 (never less than the ring's bytes), at most this
# (ddp: the loss's 4 bytes; zero1: the 64-block padding of this tiny model's shards)
BYTES_BOUND = {"ddp": 1.01, "zero1": 1.15}


@pytest.fixture(scope="module")
def quick():
    p = plan(True)
    rows = reduction.run_child(True, fma=False, modes=("native", "canonical"), timeout_s=240)
    return reduction.table(rows, None, p.reduction_model)


def check_bytes(r: dict) -> None:
    """What the theory says of canonical's bytes against native's (see the module docstring)."""
    assert r["native_bytes"] > 0 and r["canonical_bytes"] > 0, r
    assert 1 <= r["bytes_ratio"] <= BYTES_BOUND[r["strategy"]], r
    assert "all-to-all" in r["canonical_ops"] and "all-gather" in r["canonical_ops"], r
    assert "all-reduce" not in r["canonical_ops"], r  # the tree replaces every psum


def test_rows_exist_with_positive_bytes_and_times(quick):
    assert [(r["strategy"], r["collectives"], r["devices"]) for r in quick] == [("ddp", None, 2), ("zero1", "xla", 2)]
    for r in quick:
        assert r["shards"] == 4  # batch 16, N = 2: the default S keeps 4 rows a shard
        for mode in ("native", "canonical"):
            assert r[f"{mode}_step_s"] > 0 and r[f"{mode}_temp_bytes"] > 0 and r[f"{mode}_compile_s"] > 0, r
        assert math.isclose(r["ratio"], r["canonical_step_s"] / r["native_step_s"])
        assert r["extra_bytes"] == r["canonical_bytes"] - r["native_bytes"]
        assert r["extra_temp_bytes"] == r["canonical_temp_bytes"] - r["native_temp_bytes"]
        assert "native_fma_step_s" not in r  # --quick measures no FMA reference
    assert quick[0]["native_ops"] == {"all-reduce": 1}  # native ddp: one psum of gradients and loss


@pytest.mark.parametrize("strategy", ["ddp", "zero1"])
def test_canonical_sends_a_ring_all_reduce_worth(quick, strategy):
    check_bytes(next(r for r in quick if r["strategy"] == strategy))


@pytest.mark.parametrize("broken", ["swapped", "all-reduce of the stacked partials"])
def test_bytes_check_catches_a_wrong_measurement(quick, broken):
    r = dict(quick[0])
    if broken == "swapped":  # native's and canonical's programs read the other way round
        r["native_bytes"], r["canonical_bytes"] = r["canonical_bytes"], r["native_bytes"]
        r["native_ops"], r["canonical_ops"] = r["canonical_ops"], r["native_ops"]
    else:  # canonical by an all-reduce of the N partial sums: N times the bytes
        r["canonical_bytes"] *= 2
        r["canonical_ops"] = {"all-reduce": 1}
    r["bytes_ratio"] = r["canonical_bytes"] / r["native_bytes"]
    with pytest.raises(AssertionError):
        check_bytes(r)


def test_table_merges_the_fma_reference_and_markdown_shows_it(quick):
    rows = [{k: v for k, v in r.items() if not k.endswith("_ratio") and k not in ("ratio", "shards")}
            for r in quick]
    fma = [{"strategy": r["strategy"], "collectives": r["collectives"], "devices": r["devices"],
            "native_step_s": r["native_step_s"] / 2} for r in rows]
    merged = reduction.table(rows, fma, plan(True).reduction_model)
    assert [r["no_fma_cost"] for r in merged] == [2.0, 2.0]
    setup = {"fma_reference": True, "repeats": 3, "warmup_calls": 2, "note": "n",
             "model": {"hidden": (16,), "batch_size": 16, "accum": 1, "dtype": "float32", "optimizer": "adamw"}}
    text = "\n".join(reduction_section({"reduction": {"rows": merged, "setup": setup}}))
    assert "## 9." in text and "| ddp | 2 | 4 |" in text and "| zero1 (xla) | 2 | 4 |" in text
    assert text.count("| 2.00x |") == 2  # the no-FMA cost column
