"""What a fused GPU kernel reads of its operands (`fusion_reads`), on hand-written HLO: no compile, no extra."""
from __future__ import annotations

import pytest

from jaxdp.analysis import fusion_reads, projection

# ddp-ring's unpack fused into a consumer, in small: a bf16 gradient widened (the pack), two ring chunks
# written over it at a dynamic offset, and one leaf's 100 elements sliced out and used.
UNPACK = """HloModule m

%fused (p0: bf16[1000], p1: f32[500], p2: f32[500], p3: s32[]) -> f32[100] {
  %p0 = bf16[1000]{0} parameter(0)
  %p1 = f32[500]{0} parameter(1)
  %p2 = f32[500]{0} parameter(2)
  %p3 = s32[] parameter(3)
  %wide = f32[1000]{0} convert(%p0)
  %d0 = f32[1000]{0} dynamic-update-slice(%wide, %p1, %p3)
  %d1 = f32[1000]{0} dynamic-update-slice(%d0, %p2, %p3)
  %s = f32[100]{0} slice(%d1), slice={[0:100]}
  ROOT %out = f32[100]{0} multiply(%s, %s)
}

ENTRY %main (a: bf16[1000], b: f32[500], c: f32[500], i: s32[]) -> f32[100] {
  %a = bf16[1000]{0} parameter(0)
  %b = f32[500]{0} parameter(1)
  %c = f32[500]{0} parameter(2)
  %i = s32[] parameter(3)
  ROOT %f = f32[100]{0} fusion(%a, %b, %c, %i), kind=kLoop, calls=%fused
}
"""


def _computation(text: str) -> list[str]:
    return text.split("{\n", 1)[1].split("\n}", 1)[0].splitlines()


def test_a_fused_unpack_reads_the_slice_it_uses_not_every_operand_whole():
    reads, written = fusion_reads.traffic(_computation(UNPACK))
    # 100 elements demanded: the later chunk covers half the vector (50), the earlier half the rest (25), the
    # widened gradient the remaining 25 (2 bytes each); the offset scalar whole
    assert reads == [25 * 2, 25 * 4, 50 * 4, 4] and written == 100 * 4
    assert projection.hbm_bytes(UNPACK) == 354 + 400  # every operand whole (the old count): 6404 bytes


def test_a_fusion_that_reads_its_operands_whole_is_charged_them_whole():
    dot = UNPACK.replace("%s = f32[100]{0} slice(%d1), slice={[0:100]}",
                         "%s = f32[100]{0} dot(%wide, %wide), lhs_contracting_dims={0}, rhs_contracting_dims={0}")
    assert fusion_reads.traffic(_computation(dot))[0] == [1000 * 2, 0, 0, 0]  # the chunks: no longer used
    whole = UNPACK.replace("%s = f32[100]{0} slice(%d1), slice={[0:100]}", "%s = f32[100]{0} reduce(%d1)")
    # a reduction over the whole vector: each element once, from whichever operand the chain puts there
    assert fusion_reads.traffic(_computation(whole))[0] == pytest.approx([250 * 2, 250 * 4, 500 * 4, 4])


def test_a_dynamic_update_slice_of_a_parameter_at_the_root_is_written_in_place():
    lines = ["  %p0 = f32[1000]{0} parameter(0)", "  %p1 = f32[500]{0} parameter(1)", "  %p2 = s32[] parameter(2)",
             "  ROOT %d = f32[1000]{0} dynamic-update-slice(%p0, %p1, %p2)"]
    assert fusion_reads.traffic(lines) == ([0.0, 500 * 4, 4], 500 * 4)


def test_users_asking_for_the_same_elements_count_once_and_different_ones_add_up():
    """g and g * g sliced to the same leaf read that leaf once; another leaf's slice reads its own elements."""
    lines = ["  %p0 = f32[1000]{0} parameter(0)", "  %sq = f32[1000]{0} multiply(%p0, %p0)",
             "  %s1 = f32[100]{0} slice(%p0), slice={[0:100]}", "  %s2 = f32[100]{0} slice(%sq), slice={[0:100]}",
             "  %s3 = f32[100]{0} slice(%p0), slice={[500:600]}", "  %sum = f32[100]{0} add(%s1, %s2)",
             "  %s1.clone = f32[100]{0} slice(%p0), slice={[0:100]}, metadata={op_name=\"a clone\"}",
             "  ROOT %t = (f32[100]{0}, f32[100]{0}, f32[100]{0}) tuple(%sum, %s3, %s1.clone)"]
    assert fusion_reads.traffic(lines) == ([200 * 4], 300 * 4)
