"""The kernel paths in `jaxdp bench`: items 1-3 keep each path's runs apart and every row names its path
(`tables.py`, `markdown.py`), and item 13 (`fused_cost.py`) times both paths of each framework in one run, as
the ratio fused / mirrored, on a tiny gpt2."""
from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")

from jaxdp.harness.bench import fused_cost, tables  # noqa: E402
from jaxdp.harness.bench.markdown import _overhead, _step_time  # noqa: E402
from jaxdp.harness.bench.plan import FUSED_RUNS, plan, time_runs  # noqa: E402


def _entry(strategy: str, n: int, kernels: str, step_s: float, compiled: bool = False) -> dict:
    return {"strategy": strategy, "devices": n, "kernels": kernels, "compile": compiled, "median_step_s": step_s,
            "p25_step_s": step_s, "p75_step_s": step_s, "loss_last": 1.0, "first_step_s": 1.0}


def _times() -> dict:
    """Both frameworks on both paths: single 10 ms / 4 ms, ddp 11 / 6, ddp-ring 22 / 9 (mirrored / fused)."""
    fw = {}
    for path, (single, ddp, ring) in (("mirrored", (0.010, 0.011, 0.022)), ("fused", (0.004, 0.006, 0.009))):
        for strategy, n, s in (("single", 1, single), ("ddp", 2, ddp), ("ddp-ring", 2, ring)):
            fw[tables.key(strategy, n, path)] = _entry(strategy, n, path, s)
    return {"gpt": {"jax": fw, "torch": {k: {**e, "compile": e["kernels"] == "fused"} for k, e in fw.items()}}}


@pytest.mark.quick
def test_each_path_is_its_own_row_against_its_own_single_and_ddp():
    times = _times()
    steps = tables.step_time_table(times)
    assert [(r["strategy"], r["jax_path"], r["torch_path"]) for r in steps if r["strategy"] == "ddp"] == [
        ("ddp", "mirrored", "mirrored, eager"), ("ddp", "fused", "fused, compiled")]
    over = {(r["kernels"], r["strategy"]): r["over_single"] for r in tables.overhead_table(times)
            if r["framework"] == "jax"}
    assert over[("mirrored", "ddp")] == pytest.approx(1.1) and over[("fused", "ddp")] == pytest.approx(1.5)
    ring = {r["kernels"]: r["ring_over_ddp"] for r in tables.ring_table(times) if r["framework"] == "jax"}
    assert ring == pytest.approx({"mirrored": 2.0, "fused": 1.5})
    text = "\n".join(_step_time({"step_time": {"rows": steps}}))
    assert "| gpt | ddp | 2 | fused / fused, compiled | 6.0 | 6.0 |" in text
    text = "\n".join(_overhead({"dp_overhead": {"rows": tables.overhead_table(times)}}))
    assert "| gpt | ddp | 2 | fused | 1.50x |" in text


@pytest.mark.quick
def test_the_plan_times_every_path_asked_and_item_13_both():
    p = plan(True, ("mirrored", "fused"))
    paths = [(n, cfgs[0].kernels) for _, n, cfgs in time_runs(p)]
    assert paths == [(1, "mirrored"), (1, "fused"), (2, "mirrored"), (2, "fused")]
    assert fused_cost.configs(plan(False)) == [
        plan(False).fused_model.replace(dtype=d, strategy=s, devices=n) for d, s, n in FUSED_RUNS]
    assert {(c.model, c.dtype, c.strategy, c.devices, c.compile) for c in fused_cost.configs(plan(False))} == {
        ("gpt2", d, s, n, False) for d in ("float32", "bfloat16") for s, n in (("single", 1), ("ddp", 2))}
    assert [(c.dtype, c.strategy, c.devices) for c in fused_cost.configs(p)] == [("float32", "single", 1),
                                                                                 ("bfloat16", "ddp", 2)]
    compiled = fused_cost.configs(plan(True, torch_compile=True))  # bench --compile: torch's rows compiled, named so
    assert all(c.compile for c in compiled)
    rows = [fused_cost.row(compiled[0], f, [0.2, 0.1]) for f in ("jax", "torch")]
    assert [r["torch_compiled"] for r in rows] == [None, True] and rows[1]["ratio"] == pytest.approx(0.5)
    text = "\n".join(fused_cost.section({"fused_cost": {"rows": rows, "setup": {
        "model": {f: getattr(compiled[0], f) for f in ("model", "data", "n_layer", "n_head", "d_model", "seq_len",
                                                        "batch_size", "optimizer")},
        "repeats": 1, "warmup_calls": 2, "statistic": "median", "torch_threads": "1", "torch_compiled": True}}}))
    assert "| torch_ref (compiled) | float32 | single | 1 | 200.0 | 100.0 | 0.50 |" in text
    assert "both paths under torch.compile" in text


def test_item_13_times_both_paths_of_each_framework_in_one_run():
    p = dataclasses.replace(plan(True), fused_runs=(("float32", "single", 1),), fused_repeats=1)
    result = fused_cost.fused_cost_benchmark(p, lambda m: None)
    rows = result["rows"]
    assert [(r["framework"], r["dtype"], r["strategy"], r["devices"]) for r in rows] == [
        ("jax", "float32", "single", 1), ("torch", "float32", "single", 1)]
    for r in rows:
        assert r["mirrored_step_s"] > 0 and r["fused_step_s"] > 0
        assert r["ratio"] == pytest.approx(r["fused_step_s"] / r["mirrored_step_s"])
    assert rows[1]["torch_compiled"] is False
    text = "\n".join(fused_cost.section({"fused_cost": result}))
    assert "## 13. The fused path's CPU cost: fused / mirrored step time" in text
    assert "| jaxdp | float32 | single | 1 |" in text and "| torch_ref (eager) | float32 | single | 1 |" in text
