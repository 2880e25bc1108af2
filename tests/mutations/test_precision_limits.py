"""tests/mutations/precision_limits.py's wrong-gradient bug: the gradient at one step scaled and the
parameters moved by exactly what the replayed optimizer makes of the change, from that step on."""
from __future__ import annotations

import numpy as np

from jaxdp.core.traces import trace
from tests.mutations import precision_limits


def sgd_trace(lr: float = 0.1) -> trace.Trace:
    g = {1: np.array([1.0, -2.0]), 2: np.array([0.5, 4.0])}
    arrays, p = {"init/w": np.array([1.0, 1.0])}, np.array([1.0, 1.0])
    for k in (1, 2):
        p = p - lr * g[k]
        arrays |= {f"step/{k}/grad/w": g[k], f"step/{k}/param/w": p, f"step/{k}/loss": np.float64(1.0)}
    return trace.Trace({"optimizer": "sgd", "lr": lr, "dtype": "float64", "steps": 2, "first_step": 1}, arrays)


def test_a_wrong_gradient_moves_the_parameters_by_what_sgd_makes_of_it():
    t = sgd_trace()
    bad = precision_limits.wrong_grad(t, 2, "w", 1e-3)
    np.testing.assert_allclose(bad.arrays["step/2/grad/w"], 1.001 * t.arrays["step/2/grad/w"])
    np.testing.assert_allclose(bad.arrays["step/2/param/w"] - t.arrays["step/2/param/w"],
                               -0.1 * 1e-3 * t.arrays["step/2/grad/w"], rtol=1e-9)
    assert np.array_equal(bad.arrays["step/1/param/w"], t.arrays["step/1/param/w"])
