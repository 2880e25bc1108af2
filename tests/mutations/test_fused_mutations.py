"""The planted 1e-5 learning-rate bug (`lr-1.00001x`: one weight's update 1.00001x, every step) is still caught
in float32 on the fused path (docs/KERNELS.md): every run of the case with `--kernels fused`, in jaxdp and in
torch_ref, judged against its framework's fused `single` and the other framework's fused run; the honest fused
runs pass both checks (the controls)."""
from __future__ import annotations

import functools

import pytest

from tests.mutations import score

CASES = [("lr-1.00001x", "jax", "float32"), ("lr-1.00001x", "torch", "float32")]


@functools.cache
def evaluated() -> dict:
    return {r["case"][:3]: r for r in score.evaluate(CASES, kernels="fused")}  # (name, framework, dtype), 'own' model


@pytest.mark.parametrize("case", CASES, ids="-".join)
def test_a_1e5_learning_rate_bug_is_caught_on_the_fused_path(case):
    result = evaluated()[case]
    assert not score.missed(result), (score.missed(result), result)
    assert set(result["caught"]) == {"strategy", "parity"}
