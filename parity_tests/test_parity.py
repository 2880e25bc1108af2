"""jaxdp and torch_ref, same configuration, same numbers: loss, every gradient and every parameter
after every step, strategy by strategy (tolerances and their reasons: jaxdp/judge/parity.py)."""
from __future__ import annotations

import numpy as np
import pytest

from jaxdp.core.traces import trace
from jaxdp.judge import parity
from tests.helpers import as_trace, with_grads, with_update, with_value

from .cases import BF16, DIMENSIONS, FLOAT32, FLOAT64, GPT64, LLAMA_CASES, SINGLE, TRAPS
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
    assert_margin(row)


@pytest.mark.slow
@pytest.mark.parametrize("case", BF16, ids=case_id)
def test_bfloat16_gradients_and_updates_within_bf16_bounds(case):
    """bf16: gradients per tensor, every step's update and the losses, against the other framework."""
    row = compare(*case)
    assert len(row.per_step["grad"]) == 20 and row.worst["grad"] > 0
    assert_ok(row)
    assert_margin(row)


def assert_margin(row, factor=2.0):
    """Honest runs stay `factor` below every finite bound (what the bounds' derivation claims)."""
    for f in parity.FIELDS:
        assert row.worst[f] * factor <= row.tol.bound(f), (f, row.worst[f], row.tol.bound(f))


EDITS = [("negated", -1.0), ("skipped", 0.0), ("halved", 0.5), ("doubled", 2.0)]


@pytest.mark.parametrize("case", [FLOAT32[1], FLOAT32[2], BF16[0], BF16[-1]], ids=case_id)
def test_a_wrong_update_or_gradient_at_any_step_fails(case):
    """Issue 13's bar for the float32 and bf16 bounds: a negated, skipped, halved or doubled update at
    any single step (the last included), or the gradients of any step off by a factor 2, fail."""
    jcfg, tcfg = sides(*case)
    j, t = as_trace(jax_run(jcfg)), as_trace(torch_runs()[tcfg])
    for step in range(1, jcfg.steps + 1):
        for name, factor in EDITS:
            row = parity.compare(with_update(j, step, factor), t, jcfg)
            assert any(f.startswith(("update", "step update")) for f in row.failures), (name, step, row.failures)
        for factor in (2.0, 0.5):
            row = parity.compare(with_grads(j, step, factor), t, jcfg)
            assert any(f.startswith("grad") for f in row.failures), (factor, step, row.failures)


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


@pytest.mark.parametrize("key", ["step/2/grad/layers/0/kernel", "step/10/param/layers/2/bias", "step/5/loss"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("where", ["jax", "both"])
def test_non_finite_is_never_agreement(key, value, where):
    """A NaN or Inf in either trace fails, named by key and side, even where both sides hold it."""
    label, cfg = FLOAT32[0]
    jcfg, tcfg = sides(label, cfg)
    j, t = as_trace(jax_run(jcfg)), as_trace(torch_runs()[tcfg])
    j = with_value(j, key, value)
    t = with_value(t, key, value) if where == "both" else t
    row = parity.compare(j, t, jcfg, label)
    side = "jax" if where == "jax" else "jax and torch"
    assert f"non-finite: {key} holds NaN or Inf in {side}" in row.failures, row.failures


def single_of(cfg):
    return cfg.replace(devices=1)


@pytest.mark.parametrize("case", TRAPS, ids=case_id)
def test_roundoff_only_gradients_pass_in_both_frameworks_and_across(case):
    """Issue 23: gpt2 + AdamW (the fused key bias) and cnn with a bias before BatchNorm (+ Adam): the
    strategy against single in each framework, and jax against torch, all pass; the error model did
    work (some tensor was relaxed), so the case holds the trap."""
    label, cfg = case
    jcfg, tcfg = sides(label, cfg)
    j, t = as_trace(jax_run(jcfg)), as_trace(torch_runs()[tcfg])
    js, ts = as_trace(jax_run(single_of(jcfg).replace(strategy="single"))), as_trace(
        torch_runs()[single_of(cfg).replace(strategy="single")])
    for a, b in ((j, js), (t, ts), (j, t)):
        row = parity.judge(a, b, sides=(a.meta["framework"], b.meta["framework"]))
        assert_ok(row)
        assert row.relaxed, "no tensor needed the error model: the case lost its trap"


@pytest.mark.parametrize("case", LLAMA_CASES, ids=case_id)
def test_llama_strategy_equals_single_in_both_frameworks_and_across(case):
    """`--model llama`, float64, AdamW, accum 3: the strategy against single in jaxdp and in torch_ref,
    and jaxdp against torch_ref, all within float64's parity bounds (1e-12)."""
    label, cfg = case
    jcfg, tcfg = sides(label, cfg)
    j, t = as_trace(jax_run(jcfg)), as_trace(torch_runs()[tcfg])
    js, ts = (as_trace(r) for r in (jax_run(single_of(jcfg).replace(strategy="single")),
                                    torch_runs()[single_of(cfg).replace(strategy="single")]))
    for a, b in ((j, js), (t, ts), (j, t), (js, ts)):
        assert_ok(parity.judge(a, b, sides=(a.meta["framework"], b.meta["framework"])))


def test_without_the_error_model_the_honest_traps_would_fail(monkeypatch):
    """The old verdict on the same honest pairs: MISMATCH (what issue 23 reported)."""
    from jaxdp.judge import error_model

    monkeypatch.setattr(error_model, "allowance", lambda *args: None)
    for label, cfg in TRAPS[:3]:
        assert not compare(label, cfg).ok, (label, cfg.model, cfg.dtype)


def test_gpt_holds_embedding_rows_with_exactly_zero_gradient():
    """The unused-embedding-row case is live in GPT64's runs: some row's gradient is exactly 0."""
    jcfg, _ = sides(*GPT64[0])
    j = jax_run(jcfg)
    grads = [j.arrays[k] for k in j.arrays if k.startswith("step/") and k.endswith("/grad/tok_embed/embedding")]
    assert grads and any((np.abs(g).max(axis=1) == 0).any() for g in grads)
