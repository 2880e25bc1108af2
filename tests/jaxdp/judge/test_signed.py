"""The signed test along a tensor's update (jaxdp/judge/signed.py) on synthetic float32 norm scales: 16
elements near 1, AdamW's first updates +-1e-3 (|du| / ulp ~ 1e4: one element's update stored to ~1e-4 of
itself). Storage rounding of the model's size (each side two roundings, uniform in +-ulp / 2) never passes
its bound over many draws; a learning rate 1.0001x, under 1 ulp per element, passes it within 4 steps; a
worst-case bias as large as the arithmetic allowance is absorbed, a bug is not."""
from __future__ import annotations

import numpy as np
import pytest

from jaxdp.judge import signed

N, STEPS = 16, 4


def draw(rng, d: float = 0.0, bias: float = 0.0) -> list[float]:
    """The ratio (error over bound) after each step: B rounds twice as torch's AdamW does (the decay, then the
    step), A once as optax does (p + (update - decay)), A's update (1 + d) times B's; `bias` a systematic term
    per element along the update that the judge is told of."""
    p = np.ones(N, np.float32)
    sums, out = signed.Running(), []
    for _ in range(STEPS):
        du = (1e-3 * rng.choice([-1.0, 1.0], N) * rng.uniform(0.3, 1.0, N))
        decay = 1e-4 * p.astype(np.float64)
        after_b = ((p.astype(np.float64) - decay).astype(np.float32).astype(np.float64) + du).astype(np.float32)
        step_a = ((1 + d) * du - decay + bias * np.sign(du)).astype(np.float32)
        after_a = (p.astype(np.float64) + step_a).astype(np.float32)
        du_a, du_b = (x.astype(np.float64) - p.astype(np.float64) for x in (after_a, after_b))
        ulp = np.maximum(np.spacing(np.abs(p)), np.spacing(np.abs(after_b))).astype(np.float64)
        sums.add(du_a - du_b, np.full(N, abs(bias)), ulp, du_b)
        error, bound = sums.judged()
        out.append(error / bound)
        p = after_b
    return out


@pytest.mark.quick
def test_storage_rounding_alone_stays_within_the_bound():
    rng = np.random.default_rng(0)
    worst = max(max(draw(rng)) for _ in range(300))
    assert worst < 1, worst


@pytest.mark.quick
def test_a_learning_rate_1_0001x_is_caught_within_4_steps():
    rng = np.random.default_rng(1)
    caught = [max(draw(rng, d=1e-4)) > 1 for _ in range(50)]
    assert all(caught)


@pytest.mark.quick
def test_a_systematic_bias_within_the_arithmetic_allowance_passes_and_a_bug_beyond_it_fails():
    """The arithmetic's C_ARITH u M_i is a worst-case bias, subtracted whole: a bias that size along the update
    passes, the same bias plus lr 1.0001x does not."""
    rng = np.random.default_rng(2)
    bias = 2e-9  # ~16 u x 1e-3, the arithmetic allowance of an update of 1e-3 in float32
    assert max(max(draw(rng, bias=bias)) for _ in range(100)) < 1
    assert all(max(draw(rng, d=1e-4, bias=bias)) > 1 for _ in range(20))
