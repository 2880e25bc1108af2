"""jaxdp and torch_ref, same configuration, same numbers: loss, every gradient and every parameter
after every step, strategy by strategy (tolerances and their reasons: jaxdp/parity.py)."""
from __future__ import annotations

import numpy as np
import pytest

from jaxdp import parity, trace

from .cases import BF16, DIMENSIONS, FLOAT32, FLOAT64, GPT64, SINGLE
from .conftest import compare, jax_run, sides, torch_runs


def case_id(case):
    label, cfg = case
    return f"{label}-x{cfg.devices}-{cfg.optimizer}-acc{cfg.accum}-clip{cfg.clip_norm}-{cfg.model}-{cfg.dtype}"


def assert_ok(row: parity.Row):
    assert row.init_identical, "initial parameters are not bit-identical"
    assert row.ok, f"{row.label}: " + "; ".join(row.failures)


def test_float64_cases_cover_every_pair_of_dimensions():
    for a in DIMENSIONS:
        for b in DIMENSIONS:
            if a < b:
                met = {(case[1].devices if a == "devices" else getattr(case[1], a, case[0]),
                        case[1].devices if b == "devices" else getattr(case[1], b, case[0])) for case in FLOAT64}
                assert len(met) == len(DIMENSIONS[a]) * len(DIMENSIONS[b]), (a, b)


@pytest.mark.parametrize("case", FLOAT64 + SINGLE, ids=case_id)
def test_float64_mlp_identical_to_1e_12(case):
    row = compare(*case)
    assert len(row.per_step["grad"]) == 10  # every step compared
    assert_ok(row)


@pytest.mark.slow
@pytest.mark.parametrize("case", GPT64, ids=case_id)
def test_float64_gpt_identical_to_1e_12(case):
    assert_ok(compare(*case))


@pytest.mark.parametrize("case", FLOAT32, ids=case_id)
def test_float32_within_float32_bounds(case):
    row = compare(*case)
    assert_ok(row)
    assert row.worst["grad"] < 1e-5
    if row.cfg.optimizer in ("adam", "adamw"):  # the stated bound, and proof that it is not vacuous
        assert max(e / (k + 1) for k, e in enumerate(row.param_abs_per_step)) <= 2 * row.cfg.lr


@pytest.mark.slow
@pytest.mark.parametrize("case", BF16, ids=case_id)
def test_bfloat16_losses_track_over_20_steps(case):
    row = compare(*case)
    assert len(row.per_step["loss"]) == 20
    assert_ok(row)


def test_initial_parameters_are_bit_identical_for_every_model_and_dtype():
    for label, cfg in [FLOAT64[0], GPT64[0], FLOAT32[0], BF16[0]]:
        jcfg, tcfg = sides(label, cfg)
        j, t = jax_run(jcfg), torch_runs()[tcfg]
        inits = [k for k in t.arrays if k.startswith("init/")]
        assert inits and all(np.array_equal(j.arrays[k], t.arrays[k]) for k in inits)
        assert all(j.arrays[k].dtype == t.arrays[k].dtype for k in inits)


@pytest.mark.parametrize("corrupt", ["grad_not_divided_by_n", "param_nudged", "init_nudged"])
def test_the_harness_catches_a_wrong_update(corrupt):
    label, cfg = next(c for c in FLOAT64 if c[1].devices == 4)
    jcfg, tcfg = sides(label, cfg)
    j, t = jax_run(jcfg), torch_runs()[tcfg]
    arrays = dict(j.arrays)
    for k in list(arrays):
        if corrupt == "grad_not_divided_by_n" and k.startswith("step/3/grad/"):
            arrays[k] = arrays[k] * cfg.devices
        if corrupt == "param_nudged" and k == "step/7/param/layers/1/bias":
            arrays[k] = arrays[k] + 1e-9 * np.max(np.abs(arrays[k]))
        if corrupt == "init_nudged" and k == "init/layers/0/kernel":
            arrays[k] = np.nextafter(arrays[k], np.inf)
    row = parity.compare(trace.Trace(j.meta, arrays), trace.Trace(t.meta, t.arrays), jcfg, label)
    assert not row.ok
    assert parity.format_table([row]).count("MISMATCH") == 1
