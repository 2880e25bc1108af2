"""The judge's bounds derived from the traces (jaxdp/judge/resolution.py), both ways, on real runs of
gpt2 + AdamW (weight decay 0.1; the fused key bias whose gradient is roundoff only): jaxdp ddp on 2
devices against torch_ref single, 4 steps, float32 and float64. The honest pair is within every
derived bound; the issue's targets are caught on every tensor: a learning rate 1 + 1e-5 (float32) or
1 + 1e-12 (float64) on one tensor within 4 steps, one element's update off by 1e-5 (float32) or 1e-12
(float64); and the limit the docs state holds: a normalization scale (|p| ~ 1000 |du|) in float32
is resolved only from ~ulp(1) / |du| = 1e-4, no finer."""
from __future__ import annotations

import functools

import numpy as np
import pytest

import jaxdp
from jaxdp.core.traces import trace
from jaxdp.harness import pair_runs
from jaxdp.judge import parity, resolution, signed
from tests.jaxdp.judge import hf_pairs
from tests.mutations import GPT2
from tests.mutations.limits import element_at, scaled_element, shifted_element, with_lr

TARGET = {"float32": 1e-5, "float64": 1e-12}


@functools.cache
def pair(dtype: str) -> tuple[trace.Trace, trace.Trace]:
    cfg = GPT2.replace(steps=4, dtype=dtype)
    j = pair_runs.run_jax(cfg.replace(strategy="ddp", devices=2))
    t = pair_runs.run_torch([cfg.replace(strategy="single", devices=1)])
    t = next(iter(t.values()))
    return trace.Trace(j.meta, j.arrays), trace.Trace(t.meta, t.arrays)


def fails(a, b) -> bool:
    return not parity.judge(a, b, check_config=False).ok


def storage_limited(name: str, dtype: str) -> bool:
    """The tensors whose update float32 cannot store finely enough for the target (docs/PARITY.md)."""
    return dtype == "float32" and name.endswith("scale")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_honest_pair_is_within_every_derived_bound(dtype):
    a, b = pair(dtype)
    derived = resolution.resolve(a, b)
    assert derived is not None and not derived.beyond, derived.failures()
    assert max(c.ratio for c in derived.cells) < 1
    assert parity.judge(a, b, check_config=False).ok


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_learning_rate_off_by_the_target_on_one_tensor_is_caught(dtype):
    a, b = pair(dtype)
    missed = [n for n in b.names() if not storage_limited(n, dtype) and not fails(with_lr(a, n, TARGET[dtype]), b)]
    assert not missed


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_element_off_by_the_target_is_caught(dtype):
    a, b = pair(dtype)
    missed = [n for n in b.names()
              if not storage_limited(n, dtype) and not fails(scaled_element(a, 2, n, TARGET[dtype]), b)]
    assert not missed


def test_the_stated_float32_limit_of_a_normalization_scale_is_real():
    """ulp(1) = 1.2e-7 against an update of 1e-3: per element 1e-4 of it is below what float32 stores; summed
    along the update over 64 elements and 4 steps (the signed test) 1e-4 is seen, 1e-5 is not."""
    a, b = pair("float32")
    assert not fails(with_lr(a, "ln_f/scale", 1e-5), b)
    assert fails(with_lr(a, "ln_f/scale", 1e-4), b)


def first_caught(a, b, name: str) -> tuple[int | None, list]:
    """The first step at which the judge's derived bounds flag `name`, and the judge's failures."""
    row = parity.judge(a, b, check_config=False)
    steps = sorted(step for step, n in row.resolution.flagged() if n == name)
    return (steps[0] if steps else None), row.failures


def norm_scales(t) -> list[str]:
    return [n for n in t.names() if n.endswith("scale")]


def test_honest_transformers_pairs_are_within_the_signed_bound():
    for name, (a, b) in hf_pairs.pairs("float32").items():
        derived = resolution.resolve(a, b)
        assert derived is not None and not derived.beyond, (name, derived.failures())
        assert derived.worst(signed.MEASURE).ratio < 0.5, name


@pytest.mark.parametrize("model", ["gpt2", "hf-gpt2", "hf-llama"])
@pytest.mark.parametrize("d", [1e-4, -1e-4])
def test_a_learning_rate_1_0001x_on_a_float32_norm_scale_is_caught_within_4_steps(model, d):
    """A scale of ~1 moved by lr 1e-3 stores each update to ~1.2e-4 of itself: only the signed test, summing
    along the update, sees lr 1 +- 1e-4 there, and names it; the pair without the bug passes it."""
    a, b = pair("float32") if model == "gpt2" else hf_pairs.pairs("float32")[model.removeprefix("hf-")]
    assert a.meta["lr"] == 1e-3 and a.meta["optimizer"] == "adamw"
    for name in norm_scales(b):
        step, failures = first_caught(with_lr(a, name, d), b, name)
        assert step is not None and step <= 4, (name, failures)
        assert any(f.startswith(signed.MEASURE) for f in failures), failures
        if model.startswith("hf-"):  # there, no other measure sees it: the pair passed before the signed test
            assert all(f.startswith(signed.MEASURE) for f in failures), failures


ABSOLUTE = {"float32": 1e-5, "float64": 1e-12}


@pytest.mark.parametrize(("model", "dtype", "share"), [
    (m, d, s) for m in ("gpt2", "hf-llama") for d in ("float32", "float64") for s in (1e-3, None)
    if (m, d, s) != ("hf-llama", "float64", None)])  # that one: the median element, as gpt2's float64 case
def test_one_element_off_by_the_absolute_target_is_caught_wherever_its_update_is_not_tiny(model, dtype, share):
    """Issue 70's per-element limit: one element's update at step 2 off by 1e-5 (float32) or 1e-12 (float64),
    absolute, either sign, on every tensor: the element whose update is the smallest at least 1e-3 of the
    tensor's largest (`share` 1e-3), and the tensor's median element (None). Each element is judged against
    its own storage and arithmetic, never a tensor's: the element 12x below its tensor's median is caught."""
    a, b = pair(dtype) if model == "gpt2" else hf_pairs.pairs(dtype)[model.removeprefix("hf-")]
    missed = []
    for name in b.names():
        index = element_at(a, 2, name, share)
        missed += [(name, d) for d in (ABSOLUTE[dtype], -ABSOLUTE[dtype])
                   if not fails(shifted_element(a, 2, name, index, d), b)]
    assert not missed


def test_a_bug_on_the_relaxed_tensor_is_not_called_roundoff():
    """The fused bias holds the key third whose gradient is roundoff only: its lr bug fails, and the
    tensor is not listed as explained by roundoff."""
    a, b = pair("float32")
    row = parity.judge(with_lr(a, "h/0/attn/c_attn/bias", 1e-5), b, check_config=False)
    assert not row.ok and any(f.startswith("resolved") for f in row.failures), row.failures
    assert "h/0/attn/c_attn/bias" not in {r.name for r in row.relaxed}


def test_the_diff_names_the_first_step_and_tensor_of_a_small_bug():
    a, b = pair("float32")
    verdict = jaxdp.diff(with_lr(a, "h/0/mlp/c_fc/kernel", 1e-5), b, check_config=False)
    assert not verdict.ok
    assert (verdict.first.step, verdict.first.name) == (1, "h/0/mlp/c_fc/kernel"), verdict.first
    assert verdict.first.measure in resolution.MEASURES and verdict.first.index is not None


def test_a_tensor_whose_shape_changes_is_named_not_a_traceback():
    """The derived bounds run on every pair: a malformed trace (a parameter's shape changed mid-run) gets
    the judge's shape message, never a numpy broadcasting error."""
    from tests.jaxdp.judge.test_error_model import run

    a, b = run("float32", 1), run("float32", 2)
    arrays = dict(a.arrays)
    arrays["step/2/param/mlp/kernel"] = arrays["step/2/param/mlp/kernel"][:, :-1]
    with pytest.raises(trace.TraceError, match="shape mismatch"):
        parity.judge(trace.Trace(a.meta, arrays), b, check_config=False)


def test_the_diff_of_a_bug_only_the_derived_bounds_see_prints_its_text(tmp_path, capsys):
    """Where only the derived bounds fail the judge skips the allowance: the CLI's text still renders,
    and says why (a run against itself with one tensor's learning rate 1 + 1e-13, float64)."""
    from jaxdp.harness import cli
    from tests.jaxdp.judge.test_error_model import run

    b = run("float64", 1)
    bug = with_lr(b, "mlp/kernel", 1e-13)
    path_a, path_b = str(tmp_path / "a.npz"), str(tmp_path / "b.npz")
    trace.save(path_a, bug.meta, bug.arrays)
    trace.save(path_b, b.meta, b.arrays)
    assert cli.main(["diff", path_a, path_b, "--no-config-check"]) == 1
    out = capsys.readouterr().out
    assert "first divergence: step 1, param, mlp/kernel" in out and "not applied" in out, out


def test_a_tensor_whose_gradients_agree_bitwise_is_not_explained_by_them():
    """A run against itself whose norm scale was stored an ulp(1) apart at step 1 (random signs: storage, not a
    bug): its gradients are bitwise B's, so its relaxed line says nothing came from them and names what was
    allowed, one ulp of storage; an element whose gradients do differ keeps its replayed explanation."""
    _, b = pair("float32")
    name, key = "ln_f/scale", "step/1/param/ln_f/scale"
    p = b.arrays[key]
    signs = np.random.default_rng(0).choice([-1.0, 1.0], p.shape)
    a = trace.Trace(b.meta, {**b.arrays, key: (p.astype(np.float64) + signs * 2.0 ** -23).astype(p.dtype)})
    row = parity.judge(a, b, check_config=False)
    assert row.ok, row.failures
    lines = [r.describe(row.allowance.opt) for r in row.relaxed if (r.step, r.name) == (1, name)]
    assert lines, [r.describe(row.allowance.opt) for r in row.relaxed]
    assert "bitwise equal" in lines[0] and "nothing is allowed from the gradients" in lines[0], lines[0]
    assert "one ulp of the stored parameter" in lines[0] and "amplifies" not in lines[0], lines[0]
    honest = parity.judge(*pair("float32"), check_config=False)  # the fused key bias: gradients that differ
    texts = [r.describe(honest.allowance.opt) for r in honest.relaxed if r.field == "update"]
    assert all("bitwise equal" not in t and "differ by" in t for t in texts), texts


def test_the_diff_names_a_scale_bug_along_the_update():
    a, b = hf_pairs.pairs("float32")["llama"]
    verdict = jaxdp.diff(with_lr(a, "norm/scale", 1e-4), b, check_config=False)
    assert not verdict.ok and (verdict.first.name, verdict.first.measure) == ("norm/scale", signed.MEASURE)
    assert "summed along the update" in verdict.first.describe(), verdict.first.describe()
