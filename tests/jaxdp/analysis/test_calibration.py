"""The calibrated projection (analysis/calibration.py, kernels.py) on hand-written HLO, and the calibration table
(jaxdp/assets/calibration.json, written by `python -m jaxdp.analysis.calibration_points`) against its targets."""
from __future__ import annotations

import copy
import json

import pytest

from jaxdp.analysis import calibration, calibration_points, kernels
from jaxdp.core.run import targets

H100 = targets.TARGETS["h100"]

# One step: a GEMM fusion, a loop fusion, a copy, a cuDNN attention call, an all-reduce (not a kernel here), and a
# loop of 3 trips around one more loop fusion.
HLO = """HloModule m

%gemm_computation (a: bf16[64,128], b: bf16[128,256]) -> bf16[64,256] {
  %a = bf16[64,128]{1,0} parameter(0)
  %b = bf16[128,256]{1,0} parameter(1)
  ROOT %dot.1 = bf16[64,256]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%loop_computation (x: f32[1024]) -> f32[1024] {
  %x = f32[1024]{0} parameter(0)
  ROOT %neg = f32[1024]{0} negate(%x)
}

%body (t: (s32[], f32[1024])) -> (s32[], f32[1024]) {
  %t = (s32[], f32[1024]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %v = f32[1024]{0} get-tuple-element(%t), index=1
  %f = f32[1024]{0} fusion(%v), kind=kLoop, calls=%loop_computation
  ROOT %r = (s32[], f32[1024]{0}) tuple(%i, %f)
}

%cond (t: (s32[], f32[1024])) -> pred[] {
  %t = (s32[], f32[1024]{0}) parameter(0)
  ROOT %p = pred[] constant(true)
}

ENTRY %main (p0: bf16[64,128], p1: bf16[128,256], p2: f32[1024], q: bf16[2,128,4,64]) -> f32[1024] {
  %p0 = bf16[64,128]{1,0} parameter(0)
  %p1 = bf16[128,256]{1,0} parameter(1)
  %p2 = f32[1024]{0} parameter(2)
  %q = bf16[2,128,4,64]{3,2,1,0} parameter(3)
  %g = bf16[64,256]{1,0} fusion(%p0, %p1), kind=kCustom, calls=%gemm_computation, BACKEND
  %l = f32[1024]{0} fusion(%p2), kind=kLoop, calls=%loop_computation
  %c = f32[1024]{0} copy(%l)
  %att = (bf16[2,128,4,64]{3,2,1,0}, u8[0]{0}) custom-call(%q, %q, %q), custom_call_target="__cudnn$fmhaSoftmax"
  %ar = f32[1024]{0} all-reduce(%c), replica_groups={{0,1}}, to_apply=%loop_computation
  %t0 = (s32[], f32[1024]{0}) tuple(%p0, %ar)
  %w = (s32[], f32[1024]{0}) while(%t0), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %out = f32[1024]{0} get-tuple-element(%w), index=1
}
""".replace("BACKEND", 'backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}')


def test_each_kernel_is_read_with_its_kind_runs_flops_and_bytes():
    found = kernels.read(HLO)
    kinds = kernels.by_kind(found)
    assert {k: v["count"] for k, v in kinds.items()} == {"gemm": 1, "attention": 1, "fusion": 1 + 3, "copy": 1}
    assert kinds["gemm"]["flops"] == 2 * 64 * 256 * 128
    assert kinds["gemm"]["bytes"] == 2 * (64 * 128 + 128 * 256 + 64 * 256)
    assert kinds["fusion"]["bytes"] == 4 * 2 * 4096  # read and written once, in the entry and 3 times in the loop
    assert kinds["attention"]["flops"] == 4 * 2 * 128 * 4 * 64 * 128  # 4 b s_q h d s_k
    assert kinds["copy"]["bytes"] == 2 * 4096


def test_each_kind_is_priced_at_its_efficiency_and_every_kernel_pays_the_launch():
    found = [["gemm", 1, 1e12, 1.0], ["fusion", 2, 0.0, 1e9], ["copy", 1, 0.0, 1e9], ["attention", 1, 1e12, 0.0]]
    s = calibration.compute_seconds(found, H100, "bfloat16")
    assert s["gemm"] == pytest.approx(1e12 / (989e12 * calibration.GEMM_EFFICIENCY))
    assert s["fusion"] == pytest.approx(2e9 / (3.35e12 * calibration.MEMORY_EFFICIENCY))
    assert s["copy"] == pytest.approx(1e9 / (3.35e12 * calibration.MEMORY_EFFICIENCY))
    assert s["attention"] == pytest.approx(1e12 / (989e12 * calibration.ATTENTION_EFFICIENCY))
    assert s["launch"] == pytest.approx(5 * calibration.LAUNCH_S)
    memory_bound = calibration.compute_seconds([["gemm", 1, 1.0, 1e9]], H100, "bfloat16")["gemm"]
    assert memory_bound == pytest.approx(1e9 / (3.35e12 * calibration.MEMORY_EFFICIENCY))  # a GEMM's max


def test_overlapped_compute_hides_an_async_collective_not_a_synchronous_one():
    op = {"op": "all-reduce", "bytes_per_device": 450e9 * 1e-3, "group_size": 8, "nodes": 1, "trips": 1,
          "async": True, "overlap_flops": 989e12 * calibration.GEMM_EFFICIENCY * 2e-3, "devices": 8}
    comm, exposed = calibration.comm_seconds([op], H100, 989e12)
    assert comm > 1e-3 and exposed == 0.0
    comm, exposed = calibration.comm_seconds([{**op, "async": False}], H100, 989e12)
    assert exposed == comm


def test_the_range_holds_every_calibration_point_of_its_kind():
    table = {"points": [{"name": "a", "kind": "step", "included": True, "ratio": 0.9},
                        {"name": "b", "kind": "step", "included": True, "ratio": 1.2},
                        {"name": "c", "kind": "scaling", "included": True, "ratio": 1.5},
                        {"name": "d", "kind": "published", "included": False, "ratio": 3.0}]}
    one = calibration.error_range(1.0, 1, table)
    assert (one["step_low_s"], one["step_high_s"], one["calibrated_on"]) == (0.9, 1.2, ["a", "b"])
    many = calibration.error_range(1.0, 16, table)  # c keeps 1.5x the throughput projected: a step 1/1.5 as long
    assert (many["step_low_s"], many["step_high_s"], many["calibrated_on"]) == (pytest.approx(1 / 1.5), 1.2,
                                                                                  ["a", "b", "c"])
    assert calibration.error_range(2.0, 1, {"points": []})["step_low_s"] == 2.0  # no point: no range


def misses(table: dict) -> list[str]:
    """The points of the calibration table that miss their target (the issue's: project-measured within 15%,
    published and matched within 20%, zero3's 8 -> 16 GPUs at 85% or more)."""
    out = []
    for p in table["points"]:
        if p["kind"] == "target":
            out += [p["name"]] * (p["projected"] < p["reference"])
        elif p["included"]:
            limit = 0.15 if p["kind"] == "step" else 0.20
            out += [p["name"]] * (abs(p["projected"] / p["reference"] - 1) > limit)
    return out


@pytest.fixture(scope="module")
def table():
    with open(calibration.RESULTS, encoding="utf-8") as f:
        return json.load(f)


def test_every_calibration_point_meets_its_target_and_a_missed_one_is_caught(table):
    names = [p["name"] for p in table["points"]]
    assert names == [p.name for p in calibration_points.POINTS]  # the table is the code's points, all of them
    assert {p["kind"] for p in table["points"]} == {"step", "scaling", "target", "published"}
    assert misses(table) == []
    worse = copy.deepcopy(table)
    worse["points"][0]["projected"] *= 1.2  # a projection 20% off a measured GPT-2 step
    worse["points"][4]["projected"] = 0.80  # zero3 keeping 80% on 2 nodes
    assert misses(worse) == [worse["points"][0]["name"], worse["points"][4]["name"]]
    for p in table["points"]:
        assert p["source"] and (p["included"] or p["kind"] == "target" or p["excluded"])


def test_the_table_was_written_with_the_codes_constants_and_its_fit(table):
    """A constant changed without running the command again (or a fit the code did not take) fails here."""
    for name, (value, how, _) in calibration.CONSTANTS.items():
        assert table["constants"][name]["value"] == value and table["constants"][name]["how"] == how
    assert table["fit"] == {"memory_efficiency": calibration.MEMORY_EFFICIENCY, "launch_s": calibration.LAUNCH_S}


@pytest.mark.parametrize("argv", [["--help"], ["a.json", "b.json"], ["table.txt"]])
def test_the_command_refuses_bad_input_in_one_line(argv):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "jaxdp.analysis.calibration_points", *argv], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == "" and len(out.stderr.strip().splitlines()) == 1
    assert "results file" in out.stderr and ".json" in out.stderr
