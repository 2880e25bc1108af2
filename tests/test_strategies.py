"""Every strategy's trace equals `single`'s on the same configuration, in float64, to 1e-12 relative.

Why 1e-12: float64 has a unit roundoff of 1.1e-16; the strategies only reorder sums (N partial
gradients, micro-batches, ring chunks) and the optimizer amplifies nothing over 4 steps, so honest
implementations agree to ~1e-15. A wrong algorithm (a missing 1/N, a double psum, a dropped
micro-batch) is off by O(1). 1e-12 leaves three orders of margin on one side and ten on the other.
"""
from __future__ import annotations

import numpy as np
import pytest

from jaxdp import trace
from jaxdp.config import FRAMEWORK_STRATEGIES

from .conftest import BASE, run
from .pairwise import pairwise

TOL = 1e-12
DIMENSIONS = {
    "strategy": [s for s in FRAMEWORK_STRATEGIES["jax"] if s != "single" and not s.startswith("zero")],
    "devices": [1, 2, 3, 4, 8],
    "optimizer": ["sgd", "momentum", "adam", "adamw"],
    "accum": [1, 3],
    "clip_norm": [0.0, 0.5],
}
CASES = pairwise(DIMENSIONS)


def as_trace(result):
    return trace.Trace(result.meta, result.arrays)


def assert_matches_single(cfg, tol=TOL):
    got = run(cfg)
    ref = run(cfg.replace(strategy="single", devices=1))
    result = trace.diff(as_trace(got), as_trace(ref))
    bad = {k: v for k, v in result["per_array"].items() if v > tol}
    assert not bad, (
        f"{cfg.strategy} x{cfg.devices} differs from single: {sorted(bad.items(), key=lambda kv: -kv[1])[:5]}"
    )
    return result


def test_cases_cover_every_pair():
    assert len(CASES) < 40
    for a in DIMENSIONS:
        for b in DIMENSIONS:
            if a < b:
                met = {(c[a], c[b]) for c in CASES}
                assert met == {(x, y) for x in DIMENSIONS[a] for y in DIMENSIONS[b]}


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_strategy_equals_single(case):
    assert_matches_single(BASE.replace(**case))


def test_clipping_was_active_in_the_clipped_cases():
    """The clipped cases must really clip, or they test nothing: the recorded (pre-clip) gradient
    norm exceeds the 0.5 threshold in step 1."""
    res = run(BASE.replace(strategy="single", clip_norm=0.5, optimizer="sgd"))
    g = [v for k, v in res.arrays.items() if k.startswith("step/1/grad/")]
    assert np.sqrt(sum(np.sum(a**2) for a in g)) > 0.5


@pytest.mark.parametrize("strategy", ["dp", "ddp", "ddp-pmap", "ddp-bucket", "ddp-ring"])
def test_gpt_strategy_equals_single(strategy):
    cfg = BASE.replace(
        model="gpt",
        data="text",
        strategy=strategy,
        devices=2,
        steps=2,
        batch_size=8,
        n_layer=1,
        d_model=16,
        n_head=2,
        seq_len=8,
        optimizer="adamw",
        lr=1e-2,
        clip_norm=1.0,
        bucket_mb=0.005,
    )
    assert_matches_single(cfg)


def test_the_comparison_can_fail():
    """A deliberately wrong update (the summed, not averaged, gradient) is caught by the same check."""
    cfg = BASE.replace(strategy="ddp", devices=4)
    good = as_trace(run(cfg))
    wrong = trace.Trace(good.meta, dict(good.arrays))
    for k in [k for k in wrong.arrays if k.startswith("step/1/grad/")]:
        wrong.arrays[k] = wrong.arrays[k] * 4  # not divided by N
    worst = trace.diff(wrong, as_trace(run(cfg.replace(strategy="single", devices=1))))["worst"]
    assert worst["grad"] > 1.0


def test_float32_matches_single_to_float32_precision():
    """float32: unit roundoff 6e-8; reordered sums over 72 samples and 4 Adam steps stay near 1e-6."""
    cfg = BASE.replace(strategy="ddp-ring", devices=4, dtype="float32", optimizer="adam", lr=1e-3)
    got, ref = run(cfg), run(cfg.replace(strategy="single", devices=1))
    assert got.arrays["step/4/param/layers/0/kernel"].dtype == np.float32
    worst = trace.diff(as_trace(got), as_trace(ref))["worst"]
    assert worst["grad"] < 1e-5 and worst["loss"] < 1e-6, worst
    # Adam divides by sqrt(v): a gradient difference of 1e-6 relative can move a parameter by up to
    # ~lr per step where v is tiny; 4 steps at lr 1e-3 bound the parameter error by 4e-3 of scale.
    assert worst["param"] < 4 * cfg.lr, worst


def test_bfloat16_keeps_fp32_master_state_and_tracks_float32():
    cfg = BASE.replace(strategy="ddp", devices=2, dtype="bfloat16", optimizer="adam", lr=1e-3, steps=4)
    bf16, fp32 = run(cfg), run(cfg.replace(dtype="float32"))
    assert bf16.arrays["step/4/param/layers/0/kernel"].dtype == np.float32  # master parameters
    assert bf16.arrays["step/1/grad/layers/0/kernel"].dtype == np.float32  # fp32 gradient reduction
    # bf16 has 8 mantissa bits (relative precision 4e-3); the loss of a 3-layer MLP stays within 2%.
    np.testing.assert_allclose(bf16.losses, fp32.losses, rtol=2e-2)
