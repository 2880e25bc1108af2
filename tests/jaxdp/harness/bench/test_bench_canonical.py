"""`jaxdp bench` item 9 (`--reduction canonical` against `native`), in --quick: the rows exist, the
bytes and temporaries read from the compiled programs are positive, and canonical sends what the
theory says. No time is asserted (no benchmark lives in the test suite).

Theory: canonical's all-reduce is an all-to-all of each device's partial sums plus an all-gather of
the chunk it reduced, (N-1)/N B each: 2(N-1)/N B, the bytes of psum's ring all-reduce. Measured (tiny
mlp, N = 2): ddp sends 4 bytes more than native (the loss, in canonical's own all-to-all and
all-gather: native folds it into the gradient's all-reduce), zero1 about 7% more (the canonical
layout pads every parameter's flat shard to a multiple of 64 blocks, `reduction.BLOCKS`).

The cnn (sync BatchNorm, ddp N = 2) row adds the running statistics' program: canonical reduces
each device's S/N shard partial sums locally and all-gathers the N device partials of every
statistic pass (the mean's, then the variance's: 2 per BatchNorm layer), C floats each, so each
device sends 2 (N-1) C x 4 bytes per layer. Measured (channels 2,4, N = 2): 48 bytes, and native's
five all-reduces 96 (its statistics with counts; at N = 2 the gather of N x C sends less than a
ring all-reduce of more floats), so canonical's statistics program is not asserted to send more.

The measurement runs in a child process started with XLA_FLAGS=--xla_cpu_max_isa=AVX (canonical
needs it before JAX starts; this test session's process has JAX up without it), shared by the tests.
"""
from __future__ import annotations

import math

import pytest

from jaxdp.harness.bench import reduction
from jaxdp.harness.bench.markdown import reduction_section
from jaxdp.harness.bench.plan import plan

# canonical / native bytes per step: at least 1 (never less than the ring's bytes), at most this
# (ddp: the loss's 4 bytes; zero1: the 64-block padding of this tiny model's shards)
BYTES_BOUND = {"ddp": 1.01, "zero1": 1.15}
FLOAT32 = 4


@pytest.fixture(scope="module")
def quick():
    p = plan(True)
    rows = reduction.run_child(True, fma=False, modes=("native", "canonical"), timeout_s=240)
    return reduction.table(rows, None, reduction.models(p))


def mlp(rows: list, strategy: str) -> dict:
    return next(r for r in rows if r["model"] == "mlp" and r["strategy"] == strategy)


def check_bytes(r: dict) -> None:
    """What the theory says of canonical's bytes against native's (see the module docstring)."""
    assert r["native_bytes"] > 0 and r["canonical_bytes"] > 0, r
    assert 1 <= r["bytes_ratio"] <= BYTES_BOUND[r["strategy"]], r
    assert "all-to-all" in r["canonical_ops"] and "all-gather" in r["canonical_ops"], r
    assert "all-reduce" not in r["canonical_ops"], r  # the tree replaces every psum


def check_stats_bytes(r: dict, channels: tuple) -> None:
    """Canonical's statistics program: two all-gathers per BatchNorm layer of the N devices' partial
    sums (see the module docstring), and in the row's bytes; native's: all-reduces."""
    n = r["devices"]
    assert r["native_stats_bytes"] > 0 and set(r["native_stats_ops"]) == {"all-reduce"}, r
    assert r["canonical_stats_ops"] == {"all-gather": 2 * len(channels)}, r
    assert r["canonical_stats_bytes"] == 2 * (n - 1) * FLOAT32 * sum(channels), r
    for mode in ("native", "canonical"):
        train, stats = r[f"{mode}_train_bytes"], r[f"{mode}_stats_bytes"]
        assert train > 0 and r[f"{mode}_bytes"] == train + stats, r  # the timed call's: both programs'


def test_rows_exist_with_positive_bytes_and_times(quick):
    assert [(r["model"], r["strategy"], r["collectives"], r["devices"]) for r in quick] == [
        ("mlp", "ddp", None, 2), ("mlp", "zero1", "xla", 2), ("cnn", "ddp", None, 2)]
    for r in quick:
        assert r["shards"] == 4  # batch 16 (mlp and cnn), N = 2: the default S keeps 4 rows a shard
        for mode in ("native", "canonical"):
            assert r[f"{mode}_step_s"] > 0 and r[f"{mode}_temp_bytes"] > 0 and r[f"{mode}_compile_s"] > 0, r
        assert math.isclose(r["ratio"], r["canonical_step_s"] / r["native_step_s"])
        assert r["extra_bytes"] == r["canonical_bytes"] - r["native_bytes"]
        assert r["extra_temp_bytes"] == r["canonical_temp_bytes"] - r["native_temp_bytes"]
        assert "native_fma_step_s" not in r  # --quick measures no FMA reference
    assert quick[0]["native_ops"] == {"all-reduce": 1}  # native ddp: one psum of gradients and loss
    assert all(("native_stats_bytes" in r) == (r["model"] == "cnn") for r in quick)


def test_cnn_statistics_program_sends_the_gathers_of_the_partial_sums(quick):
    r = quick[-1]
    check_stats_bytes(r, plan(True).reduction_bn_model.channels)
    assert "all-reduce" not in r["canonical_ops"], r  # the train step's gradients and BatchNorm's too


@pytest.mark.parametrize("broken", ["stats not counted", "swapped", "all-reduce of the stacked partials"])
def test_stats_bytes_check_catches_a_wrong_measurement(quick, broken):
    r, channels = dict(quick[-1]), plan(True).reduction_bn_model.channels
    if broken == "stats not counted":  # the timed call's bytes without the statistics program's
        r["canonical_bytes"] -= r["canonical_stats_bytes"]
    elif broken == "swapped":
        r["native_stats_bytes"], r["canonical_stats_bytes"] = r["canonical_stats_bytes"], r["native_stats_bytes"]
        r["native_stats_ops"], r["canonical_stats_ops"] = r["canonical_stats_ops"], r["native_stats_ops"]
    else:  # the N partial sums all-reduced: twice a ring all-gather's bytes
        r["canonical_stats_bytes"] *= 2
    with pytest.raises(AssertionError):
        check_stats_bytes(r, channels)


@pytest.mark.parametrize("strategy", ["ddp", "zero1"])
def test_canonical_sends_a_ring_all_reduce_worth(quick, strategy):
    check_bytes(mlp(quick, strategy))


@pytest.mark.parametrize("broken", ["swapped", "all-reduce of the stacked partials"])
def test_bytes_check_catches_a_wrong_measurement(quick, broken):
    r = dict(mlp(quick, "ddp"))
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
    fma[-1] |= {"model": "cnn", "native_step_s": rows[-1]["native_step_s"] / 4}  # told apart from mlp's ddp
    merged = reduction.table(rows, fma, reduction.models(plan(True)))
    assert [r["no_fma_cost"] for r in merged] == [2.0, 2.0, 4.0]
    setup = {"fma_reference": True, "repeats": 3, "warmup_calls": 2, "note": "n", "bn_note": "b",
             "model": {"hidden": (16,), "batch_size": 16, "accum": 1, "dtype": "float32", "optimizer": "adamw"},
             "bn_model": {"channels": (2, 4), "batchnorm": "sync", "batch_size": 16, "accum": 1, "dtype": "float32",
                          "optimizer": "adamw"}}
    text = "\n".join(reduction_section({"reduction": {"rows": merged, "setup": setup}}))
    assert "## 9." in text and "| mlp | ddp | 2 | 4 |" in text and "| mlp | zero1 (xla) | 2 | 4 |" in text
    assert "| cnn | ddp | 2 | 4 |" in text and "cnn channels 2,4, sync BatchNorm" in text
    assert text.count("| 2.00x |") == 2 and text.count("| 4.00x |") == 1  # the no-FMA cost column
    assert f"| ddp | 2 | {merged[-1]['native_stats_bytes']:.0f} | {merged[-1]['canonical_stats_bytes']:.0f} |" in text


def test_torch_rows_stand_beside_the_jaxdp_rows(quick):
    """Item 9's torch side (`reduction_torch`): torch_ref's canonical / native for every quick row whose
    strategy torch_ref has (zero1 once: torch has no --collectives), each with the jaxdp row's ratio, and
    a table of its own in the markdown."""
    from jaxdp.harness.bench import reduction_torch

    rows = reduction_torch.side_by_side(reduction_torch.torch_rows(plan(True), print), quick)
    assert [(r["framework"], r["model"], r["strategy"], r["devices"], r["shards"]) for r in rows] == [
        ("torch", "mlp", "ddp", 2, 4), ("torch", "mlp", "zero1", 2, 4), ("torch", "cnn", "ddp", 2, 4)]
    for r, j in zip(rows, quick, strict=True):
        assert r["native_step_s"] > 0 and r["canonical_step_s"] > 0 and r["native_temp_bytes"] > 0, r
        assert math.isclose(r["ratio"], r["canonical_step_s"] / r["native_step_s"])
        assert r["jaxdp_ratio"] == j["ratio"]  # the same model, strategy and N
    text = "\n".join(reduction_section({"reduction": {"rows": [], "torch_rows": rows, "setup": {
        "fma_reference": False, "repeats": 3, "warmup_calls": 2, "note": "n", "model": {
            "hidden": (16,), "batch_size": 16, "accum": 1, "dtype": "float32", "optimizer": "adamw"}}}}))
    assert "torch_ref, the same rows" in text and f"| {rows[1]['jaxdp_ratio']:.2f}x |" in text
