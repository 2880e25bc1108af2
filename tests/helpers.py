"""Helpers shared by the test suites (tests/ and parity_tests/): judging a run against a reference
with the project's one judge (`jaxdp.parity.judge`), and edited copies of a trace for the tests
that prove a check can fail (a wrong update or gradient at one step, a NaN)."""
from __future__ import annotations

import numpy as np

from jaxdp.core.traces import trace
from jaxdp.judge import parity
from tests.mutations.limits import scaled_update


def as_trace(result) -> trace.Trace:
    return trace.Trace(result.meta, result.arrays)


def judged(got, ref, tol=None, sides=("strategy", "single"), check_config=True) -> parity.Row:
    """`got` (a RunResult or Trace) judged against `ref` by the bounds for its dtype (or `tol`)."""
    got, ref = (r if isinstance(r, trace.Trace) else as_trace(r) for r in (got, ref))
    return parity.judge(got, ref, tol, sides=sides, check_config=check_config)


def assert_judged_ok(got, ref, **kw) -> parity.Row:
    row = judged(got, ref, **kw)
    assert row.ok, "; ".join(row.failures)
    return row


def with_update(t: trace.Trace, step: int, factor: float) -> trace.Trace:
    """`t` as if step `step`'s update had been multiplied by `factor` (-1 negated, 0 skipped, 0.5
    halved, 2 doubled) and every later update had been the same: parameters from `step` on move by
    (factor - 1) x that update (`tests.mutations.limits.scaled_update`, tensor by tensor)."""
    for name in t.names():
        t = scaled_update(t, step, name, factor - 1)
    return t


def with_grads(t: trace.Trace, step: int, factor: float) -> trace.Trace:
    """`t` with step `step`'s recorded gradients multiplied by `factor`."""
    arrays = {k: (v * factor).astype(v.dtype) if k.startswith(f"step/{step}/grad/") else v for k, v in t.arrays.items()}
    return trace.Trace(t.meta, arrays)


def with_value(t: trace.Trace, key: str, value: float, index=0) -> trace.Trace:
    """`t` with one element of array `key` set to `value` (e.g. NaN or Inf)."""
    arrays = dict(t.arrays)
    a = np.array(arrays[key], copy=True)
    a.reshape(-1)[index] = value
    arrays[key] = a
    return trace.Trace(t.meta, arrays)


def assert_bitwise_equal(a, b, key: str = "") -> None:
    """Bit for bit, and finite: two identical NaNs are not agreement (np.testing.assert_array_equal
    passes them)."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (key, a.dtype, b.dtype, a.shape, b.shape)
    assert a.dtype.kind != "f" or (np.isfinite(a).all() and np.isfinite(b).all()), f"{key} holds NaN or Inf"
    assert a.tobytes() == b.tobytes(), f"{key} differs"


def resumed_steps(resumed, full, first: int, exact: bool = True, tol: float = 1e-12) -> set[int]:
    """A resumed run's steps against the uninterrupted run's (bit for bit, or within `tol` of each array's
    largest magnitude): it recorded steps, none before `first`. Returns the steps it recorded."""
    keys = {k: trace.parse_key(k) for k in resumed.arrays if k.startswith("step/")}
    steps = {key.step for key in keys.values()}
    assert keys and min(steps) >= first, f"steps {sorted(steps)}: none may come before {first}"
    for k in keys:
        if exact:
            assert_bitwise_equal(resumed.arrays[k], full.arrays[k], k)
        else:
            scale = np.max(np.abs(full.arrays[k])) or 1.0
            assert np.max(np.abs(resumed.arrays[k] - full.arrays[k])) / scale < tol, k
    return steps
