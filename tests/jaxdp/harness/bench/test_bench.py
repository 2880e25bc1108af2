"""`jaxdp bench --quick` runs in a fresh process and writes valid JSON with every item of the issue
and a markdown table. No timing is asserted (no benchmark lives in the test suite): only that the
numbers are there and sane (positive times, finite ratios, bytes and memory next to their theory)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

ITEMS = ("step_time", "dp_overhead", "ring_vs_xla", "communication", "memory", "compile", "gpu_throughput",
         "collectives", "reduction", "jit_vs_hand", "nan_check", "gpu_projection", "fused_cost")


def test_bench_quick_writes_valid_json_and_markdown(tmp_path):
    out = tmp_path / "bench"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "jaxdp", "bench", "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "bench.json").read_text())
    table = (out / "bench.md").read_text()

    for key in ITEMS + ("machine", "setup", "goals"):
        assert key in results, key
    assert results["quick"] is True
    assert results["machine"]["cores"] >= 1 and results["machine"]["cpu"]

    rows = results["step_time"]["rows"]
    assert {r["strategy"] for r in rows} >= {"single", "ddp"}
    assert {(r["jax_path"], r["torch_path"]) for r in rows} == {("mirrored", "mirrored, eager"),
                                                               ("fused", "fused, eager")}  # --kernels: both paths
    for r in rows:
        assert r["jax_s"] > 0 and r["torch_s"] > 0 and math.isclose(r["jax_over_torch"], r["jax_s"] / r["torch_s"])
        assert all(math.isfinite(v) for v in r["loss_last"].values())
    for r in results["dp_overhead"]["rows"]:
        assert r["over_single"] > 0 and r["strategy"] != "single"
    assert {r["framework"] for r in results["ring_vs_xla"]["rows"]} == {"jax", "torch"}

    comm = results["communication"]["rows"]
    assert {r["devices"] for r in comm} >= {2}
    assert {r["model"] for r in comm} == {"mlp", "cnn", "gpt2"}  # the models users port: their own rows
    for r in comm:  # cnn (sync BatchNorm) and gpt2 (tied wte) equal their theory exactly, as the mlp does
        if r["model"] != "mlp":
            assert r["equal_to_theory"], r
            assert ("stats_measured_bytes" in r) == (r["model"] == "cnn")
    for r in comm:
        if "stats_measured_bytes" in r:  # BatchNorm's running statistics: their own program, next to its theory
            assert r["stats_measured_bytes"] == r["stats_theory_bytes"] > 0
    for r in comm:
        assert r["measured_bytes"] > 0 and r["theory_bytes"] > 0
        if r["strategy"] in ("ddp", "ddp-ring"):  # these equal the ring theory exactly
            assert r["equal_to_theory"], r
        if not r["equal_to_theory"]:  # a difference is explained, never hidden
            assert r["note"]
    assert all(r["equal_to_formula"] for r in results["memory"]["rows"])
    assert all(r.get("compile_s", 1) > 0 for r in results["compile"]["rows"])

    gpu = results["gpu_throughput"]
    assert "measured" in gpu and (gpu["measured"] or gpu["reason"].startswith("not measured"))
    coll = results["collectives"]["rows"]
    assert {r["op"] for r in coll} == {"all_reduce", "reduce_scatter", "all_gather"}
    assert all(r["ring_ms"] > 0 and r["xla_ms"] > 0 and math.isclose(r["ratio"], r["ring_ms"] / r["xla_ms"])
               for r in coll)
    assert [g["item"] for g in results["goals"]] == [1, 2, 3, 4, 5, 6, 7, 8]
    red = results["reduction"]  # item 9, checked in test_bench_canonical.py (this folder): here only present
    assert [(r["strategy"], r["devices"]) for r in red["rows"]] == [("ddp", 2), ("zero1", 2), ("ddp", 2)]  # mlp, cnn
    assert all(r["canonical_bytes"] >= r["native_bytes"] > 0 and r["ratio"] > 0 for r in red["rows"][:2])
    assert red["rows"][2]["model"] == "cnn" and red["rows"][2]["canonical_bytes"] > 0 and red["rows"][2]["ratio"] > 0
    checked = results["nan_check"]["rows"]  # item 11: the non-finite check, with / without, both frameworks
    assert {r["framework"] for r in checked} == {"jax", "torch"} and all(r["ratio"] > 0 for r in checked)
    assert "## 11. The non-finite check's cost" in table
    jit = results["jit_vs_hand"]["rows"]  # item 10: ddp, ddp-jit auto, ddp-jit explicit at accum 2, one run
    assert [(r["strategy"], r["axis_type"], r["accum"]) for r in jit] == [
        ("ddp", None, 2), ("ddp-jit", "auto", 2), ("ddp-jit", "explicit", 2)]
    assert all(r["step_s"] > 0 and r["peak_bytes"] > 0 and r["jit_over_hand"] > 0 for r in jit)
    assert jit[0]["measured_bytes"] == jit[2]["measured_bytes"] == jit[2]["theory_bytes"]  # once per step
    assert jit[2]["loop_bytes"] == 0 < jit[1]["loop_bytes"]  # auto: the gradient all-reduced per micro-batch
    fused = results["fused_cost"]["rows"]  # item 13: fused / mirrored, both frameworks; --quick: f32 N=1, bf16 N=2
    assert [(r["framework"], r["dtype"], r["devices"]) for r in fused] == [
        (f, d, n) for f in ("jax", "torch") for d, n in (("float32", 1), ("bfloat16", 2))]
    assert all(r["ratio"] > 0 for r in fused)
    for n in (*range(1, 12), 13):
        assert f"## {n}." in table
    assert "| cnn | ddp | 2 |" in table and "| gpt2 | ddp | 2 |" in table
