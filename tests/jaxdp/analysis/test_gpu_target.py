"""--target: small models compiled by XLA:GPU for 16 H100s on 2 nodes, from shapes, on this CPU machine
(docs/GPU.md). Needs the gpu-aot extra (the README's install has it); the schedule reader's own checks run
on hand-written HLO and need nothing."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from jaxdp.analysis import gpu_program, hlo, inspect, projection, schedule, target_memory
from jaxdp.core.run import targets
from jaxdp.core.run.config import RunConfig
from jaxdp.harness import cli

needs_extra = pytest.mark.skipif(not targets.extra_installed(), reason='needs pip install -e ".[gpu-aot]"')
SMALL = RunConfig(model="mlp", hidden=(64, 64), devices=16, batch_size=64, dtype="bfloat16")
TARGET_KEYS = {"target", "fits", "step_flops", "overlap_flops", "collectives_in_loop", "combined", "bytes_by_kind",
               "theory_by_kind", "difference", "projection"}
OP_KEYS = {"async", "overlap_ops", "overlap_flops", "arrays", "inter_node"}

# A scheduled computation: a dot of 2 x 8 x 16 x 4 FLOPs between an all-reduce's start and done.
HLO = """HloModule m

ENTRY %main (p0: f32[8,16], p1: f32[16,4]) -> f32[8,4] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %p1 = f32[16,4]{1,0} parameter(1)
  %all-reduce-start = f32[16,4]{1,0} all-reduce-start(%p1), replica_groups={{0,1}}, to_apply=%add, SYNC
  %dot.1 = f32[8,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %all-reduce-done = f32[16,4]{1,0} all-reduce-done(%all-reduce-start)
  ROOT %out = f32[8,4]{1,0} add(%dot.1, %dot.1)
}
"""


def test_the_schedule_reader_counts_the_work_under_a_collective_and_fails_when_there_is_none():
    text = HLO.replace(", SYNC", "")
    assert schedule.overlap(text)["all-reduce-start"] == {"async": True, "overlap_ops": 1, "overlap_flops": 1024.0}
    assert schedule.total_flops(text) == 1024.0
    synced = schedule.overlap(HLO.replace("SYNC", 'backend_config={"is_sync":true}'))["all-reduce-start"]
    assert synced["async"] is False  # a pair XLA runs synchronously hides nothing
    lines = text.splitlines()
    dot = next(i for i, line in enumerate(lines) if "%dot.1 =" in line)
    lines[dot], lines[dot + 1] = lines[dot + 1], lines[dot]  # the dot after the done
    moved = schedule.overlap("\n".join(lines))["all-reduce-start"]
    assert (moved["overlap_ops"], moved["overlap_flops"]) == (0, 0)  # nothing overlapped


def test_an_async_gather_of_several_arrays_counts_its_results_not_its_operands():
    line = ("  %all-gather-start = ((f32[4]{0}, f32[100]{0}), (f32[64]{0}, f32[1600]{0})) all-gather-start(%a, %b), "
            "replica_groups={{0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15}}, dimensions={0}")
    c = hlo.collective(line, 16)
    assert (c["elements"], c["arrays"]) == (1664, 2)
    line = ("  %all-to-all-start = ((f32[16,2048]{1,0}), f32[16,2048]{1,0}) all-to-all-start(%b), "
            "replica_groups={{0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15}}, dimensions={0}")
    assert hlo.collective(line, 16)["elements"] == 16 * 2048  # commas inside dims and layouts are not elements


@pytest.fixture(scope="module")
def inspected():
    """ddp (accumulating over 2 micro-batches) and zero3, compiled once each for 16 H100s on 2 nodes."""
    return {s: inspect.inspect(SMALL.replace(strategy=s, accum=2).validate(), target="h100", nodes=2)
            for s in ("ddp", "zero3")}


@needs_extra
@pytest.mark.parametrize("strategy", ["ddp", "zero3"])
def test_inspect_target_keys_and_bytes_against_theory(inspected, strategy):
    r = inspected[strategy]
    assert TARGET_KEYS <= set(r) and all(OP_KEYS <= set(c) for c in r["collectives"])
    assert r["target"]["name"] == "h100" and r["target"]["nodes"] == 2 and r["fits"]
    if strategy == "ddp":
        assert r["bytes_per_device"] == pytest.approx(r["theory_bytes_per_device"], rel=1e-9)
        assert r["difference"].startswith("bytes = theory")
    else:  # the forward's 2 gathers in bf16, the backward's 2 in fp32: 3/4 of the theory's fp32 bytes
        assert r["bytes_by_kind"]["all-gather"] == pytest.approx(0.75 * r["theory_by_kind"]["all-gather"], rel=1e-3)
        assert r["difference"].startswith("differs: all-gather") and gpu_program.ZERO3_BF16_GATHER in r["difference"]
    assert r["collectives_in_loop"] == 0  # one sync per step, outside the accumulation loop
    assert any(c["inter_node"] for c in r["collectives"])  # a group of all 16 spans both nodes
    assert ("prefetch" in r) == (strategy == "zero3")
    p = r["projection"]
    assert p["projected"] and p["step_s"] >= p["compute_s"] > 0 and 0 < p["mfu"] < 1
    assert p["step_low_s"] <= p["step_s"] <= p["step_high_s"] and set(p["parts"]) == {"compiled", "measured",
                                                                                       "modelled"}
    assert p["calibrated_on"] and all(isinstance(name, str) for name in p["calibrated_on"])
    assert all(c["nodes"] == (2 if c["inter_node"] else 1) for c in r["collectives"])


def test_bf16_collectives_explain_dp_and_zero3_only_when_the_program_sends_bf16():
    """XLA:GPU sends dp's first hop and zero3's forward gathers in bf16 before widening them (docs/GPU.md)."""
    sent = [{"op": "collective-permute", "dtype": "f32+bf16"}, {"op": "collective-permute", "dtype": "f32"}]
    r = {"strategy": "dp", "dtype": "bfloat16", "collectives": sent, "combined": 0, "theory_bytes_per_device": 10.0,
         "bytes_by_kind": {"point-to-point": 9.0}, "theory_by_kind": {"point-to-point": 10.0}}
    assert gpu_program.difference(r).endswith(gpu_program.DP_FIRST_HOP)
    r["collectives"] = [dict(c, dtype="f32") for c in sent]  # all fp32 and still fewer bytes: not this reason
    assert "not explained here" in gpu_program.difference(r)
    r = {**r, "strategy": "zero3", "bytes_by_kind": {"all-gather": 3.0}, "theory_by_kind": {"all-gather": 4.0}}
    assert "not explained here" in gpu_program.difference(r)  # zero3 gathering fp32 only: not the bf16 cast
    r["collectives"] = [{"op": "all-gather", "dtype": "bf16"}]
    assert gpu_program.ZERO3_BF16_GATHER in gpu_program.difference(r)


def test_no_prefetch_names_the_combiner_only_where_gathers_were_merged():
    merged = {"prefetch": False, "collectives": [{"op": "all-gather", "arrays": 12}]}
    assert "combine_threshold" in gpu_program.prefetch_note(merged)
    assert gpu_program.prefetch_note({**merged, "prefetch": True}) == ""
    assert gpu_program.prefetch_note({**merged, "collectives": [{"op": "all-gather", "arrays": 1}]}) == ""


def test_copy_kernels_are_counted_and_ddp_ring_says_why():
    assert gpu_program.copies(HLO) == {"count": 0, "bytes": 0}
    copied = HLO.replace("  ROOT %out", "  %copy.1 = f32[16,4]{1,0} copy(%p1)\n  ROOT %out")
    assert gpu_program.copies(copied) == {"count": 1, "bytes": 16 * 4 * 4}
    r = {"strategy": "ddp", "copies": gpu_program.copies(copied)}
    assert gpu_program.copies_note(r).startswith("copies: 1 arrays") and "ddp-ring" not in gpu_program.copies_note(r)
    assert gpu_program.RING_COPIES in gpu_program.copies_note({**r, "strategy": "ddp-ring"})


@needs_extra
def test_a_difference_from_the_theory_is_named(inspected):
    r = json.loads(json.dumps(inspected["zero3"]))
    r["bytes_by_kind"]["all-gather"] *= 2  # a deliberately wrong count: the reader must say so
    assert gpu_program.difference(r).startswith("differs: all-gather")


@needs_extra
def test_memory_rows_fit_or_not_by_the_targets_memory(monkeypatch, tmp_path):
    path = tmp_path / "rows.json"
    argv = ["memory", "--target", "h100", "--devices", "8", "--strategies", "ddp,zero3", "--hidden", "64,64",
            "--json", str(path)]
    assert cli.main(argv) == 0
    rows = json.loads(path.read_text())
    assert [r["strategy"] for r in rows] == ["ddp", "zero3"] and all(r["fits"] for r in rows)
    assert {"strategy", "peak_bytes", "device_memory_bytes", "fits", "formula"} <= set(rows[0])
    assert rows[1]["peak_bytes"] < rows[0]["peak_bytes"]
    small = targets.TARGETS["h100"]._replace(memory_bytes=rows[1]["peak_bytes"])  # a GPU just zero3's size
    monkeypatch.setitem(targets.TARGETS, "h100", small)
    assert not target_memory.row(SMALL.replace(strategy="ddp", devices=8).validate(), "h100", 1)["fits"]


def test_the_projection_charges_a_synchronous_collective_in_full():
    target = targets.TARGETS["h100"]
    op = {"bytes_per_device": target.nvlink_bytes_s * 1e-3, "trips": 1, "inter_node": False, "async": True,
          "overlap_flops": target.peak_flops * 1e-3, "group_size": 8}
    r = {"step_flops": target.peak_flops * 2e-3, "collectives": [op]}
    cfg = RunConfig(dtype="bfloat16")
    assert projection.project(r, target, HLO, 1, cfg)["exposed_comm_s"] == 0  # 1 ms hidden behind 1 ms of compute
    op["async"] = False
    assert projection.project(r, target, HLO, 1, cfg)["exposed_comm_s"] == pytest.approx(1e-3)


@needs_extra
def test_with_the_plugin_a_cpu_run_prints_nothing_and_picks_the_cpu():
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "JAX_SKIP_CUDA_CONSTRAINTS_CHECK")}
    code = "import jaxdp, jax; print(jax.devices()[0].platform)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert (out.stdout, out.stderr) == ("cpu\n", "")
    if importlib.util.find_spec("nvidia.cudnn") is not None:
        return  # a full CUDA install: JAX's check passes, there is no traceback to keep quiet
    bare = subprocess.run([sys.executable, "-c", code.replace("import jaxdp, ", "import ")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert bare.stdout == "cpu\n" and "cuDNN" in bare.stderr  # without jaxdp's setting: JAX's traceback


@needs_extra
def test_a_target_program_compiled_twice_with_a_persistent_cache_is_quiet():
    """The suite sets a persistent compilation cache (conftest.py), as a user may: JAX then tries to read the
    second compile of a target program back from it through a client it has not, and warned each time."""
    import warnings

    from jaxdp.analysis import aot

    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        pytest.skip("no persistent compilation cache in this session")
    cfg = RunConfig(model="mlp", hidden=(8,), devices=8, batch_size=8, strategy="ddp").validate()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            aot.TargetStep(cfg, "h100", 1)
    assert not [w for w in seen if aot.CACHE_READ in str(w.message)]


GPT2_BF16 = RunConfig(model="gpt2", data="text", n_layer=1, n_head=2, d_model=16, seq_len=8, devices=4, batch_size=32,
                      dtype="bfloat16", axis_type="auto")


@needs_extra
@pytest.mark.parametrize("strategy", ["ddp-jit", "zero1-jit", "fsdp-jit"])
def test_the_jit_strategies_reduce_bf16_runs_in_fp32_on_the_gpu_program(strategy):
    """XLA:GPU reduces bf16 in bf16 (no widening), so its program's types are the reading: every all-reduce and
    reduce-scatter of the -jit strategies' gpt2 step carries f32 (before issue 67's fix, ddp-jit's carried a bf16
    all-reduce of 3,344 elements, zero1-jit's a bf16 reduce-scatter, fsdp-jit's bf16 reductions of activations):
    one fp32 reduction of the whole gradient, or of each device's shard of it."""
    r = inspect.inspect(GPT2_BF16.replace(strategy=strategy).validate(), target="h100")
    reductions = [c for c in r["collectives"] if c["op"] in ("all-reduce", "reduce-scatter")]
    assert reductions and all(c["dtype"] in ("f32", "pred") for c in reductions), r["collectives"]
    grad = max(reductions, key=lambda c: c["elements"])  # 4176 parameters (+ the loss), or their shard of 4
    assert (grad["dtype"], grad["elements"]) == ("f32", 4177 if strategy == "ddp-jit" else 1044), grad
