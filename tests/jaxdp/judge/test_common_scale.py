"""The judge's common factor (jaxdp/judge/resolution.py: `common_scale`, the share of Adam's update that its
bias corrections' rounding can move on every tensor at once), both ways, on synthetic tensors shaped like the
cnn's false alarm (docs/PARITY.md): three biases near 2e-3 (storage ulp 4e-19), three kernels (ulp 5e-17) and
two BatchNorm scales near 1 (ulp 2.2e-16), updates near 1e-3, float64.

Honest: with no common factor, the fit follows the tensors that resolve it (the plain median followed the
noisy half to 3e-15, 7 of a bias's ulps). A real common factor is recovered. A bug in one tensor, however
precise, does not become everyone's factor; the clamp holds."""
from __future__ import annotations

import numpy as np
import pytest

from jaxdp.judge import resolution

SHAPES = {"b1": (4,), "b2": (4,), "b3": (10,), "k1": (36,), "k2": (36,), "k3": (36,), "s1": (4,), "s2": (4,)}
ULP = {"b": 4.3e-19, "k": 5e-17, "s": 2.2e-16}
LIMIT = 1.48e-13  # bias_limits' v clamp at step 3 in float64


def tensors(seed=0, common=0.0, bug: dict | None = None):
    """(residual, by_v, ulps): each tensor's residual = (common + its bug) x by_v + its storage noise."""
    rng = np.random.default_rng(seed)
    residual, by_v, ulps = {}, {}, {}
    for name, shape in SHAPES.items():
        a = rng.uniform(0.5e-3, 1.5e-3, shape) * rng.choice([-1, 1], shape)
        ulp = np.full(shape, ULP[name[0]])
        by_v[name], ulps[name] = a, ulp
        residual[name] = (common + (bug or {}).get(name, 0.0)) * a + rng.uniform(-2, 2, shape) * ulp
    return residual, by_v, ulps


def test_with_no_common_factor_the_fit_follows_the_tensors_that_resolve_it():
    for seed in range(20):
        residual, by_v, ulps = tensors(seed)
        s = resolution.common_scale(LIMIT, residual, by_v, ulps)
        assert abs(s) * 1e-3 < 0.6 * ULP["b"], (seed, s)  # a bias: < 0.6 ulp (unweighted: 8.6)


def plain_median(residual, by_v) -> float:
    """The fit before the weights: the median of the tensors' least-squares factors, clamped."""
    factors = [float(np.sum(residual[n] * a)) / float(np.sum(a * a)) for n, a in by_v.items()]
    return float(np.clip(np.median(factors), -LIMIT, LIMIT))


def test_the_unweighted_median_is_what_raised_the_false_alarm():
    worst = max(abs(plain_median(*tensors(seed)[:2])) for seed in range(20))
    assert worst * 1e-3 > 2 * ULP["b"]  # without the weights: more than the 2 ulps a bias's element is allowed


def test_a_factor_common_to_every_tensor_is_recovered():
    for common in (3e-14, -1e-13):
        residual, by_v, ulps = tensors(1, common=common)
        assert resolution.common_scale(LIMIT, residual, by_v, ulps) == pytest.approx(common, rel=0.01)


def test_a_bug_in_one_tensor_is_not_made_common_and_the_clamp_holds():
    for name in SHAPES:
        residual, by_v, ulps = tensors(2, bug={name: 1e-13})
        s = resolution.common_scale(LIMIT, residual, by_v, ulps)
        assert abs(s) < 1e-14, (name, s)
    residual, by_v, ulps = tensors(3, common=1e-12)
    assert resolution.common_scale(LIMIT, residual, by_v, ulps) == LIMIT


def test_no_tensor_weighs_more_than_a_third():
    for w in ([100.0, 1, 1], [1.0, 1, 1], [5.0, 4, 1, 1, 1], [1e30, 1e20, 1, 1, 1, 1], [1.0, 2, 3, 4, 5, 6, 7]):
        c = resolution.capped(np.array(w), 1 / 3)
        assert c.max() <= c.sum() / 3 * (1 + 1e-12) and (c <= np.array(w)).all()
    assert (resolution.capped(np.array([1.0, 2, 3, 4, 5, 6, 7]), 1 / 3) == [1, 2, 3, 4, 5, 6, 7]).all()


def test_a_tensor_resolved_beyond_float64_or_not_at_all_keeps_the_fit_finite():
    assert (resolution.capped(np.array([np.inf, 1.0, 1.0, 1.0]), 1 / 3) <= 1.5).all()
    assert (resolution.capped(np.array([np.inf, np.inf, np.inf]), 1 / 3) == 1).all()
    assert (resolution.capped(np.array([0.0, 0.0, np.nan]), 1 / 3) == 1).all()
    residual, by_v, ulps = tensors(4)
    ulps["b1"] = np.zeros_like(ulps["b1"])  # its weight past float64
    s = resolution.common_scale(LIMIT, residual, by_v, ulps)
    assert np.isfinite(s) and abs(s) * 1e-3 < ULP["b"]
