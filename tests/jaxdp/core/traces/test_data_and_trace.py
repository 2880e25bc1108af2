"""Data is a pure function of (seed, step); the trace round-trips and refuses what it cannot read."""
from __future__ import annotations

import numpy as np
import pytest

from jaxdp.core.run import data
from jaxdp.core.traces import trace
from tests.conftest import BASE, run


@pytest.mark.parametrize("name", ["synthetic", "digits", "text"])
def test_batches_are_deterministic_and_differ_by_step(name):
    a, b = data.load(name, seed=1), data.load(name, seed=1)
    x1, y1 = a.batch(1, 16)
    x1b, y1b = b.batch(1, 16)
    np.testing.assert_array_equal(x1, x1b)
    np.testing.assert_array_equal(y1, y1b)
    assert not np.array_equal(a.batch(2, 16)[0], x1)
    assert not np.array_equal(data.load(name, seed=2).batch(1, 16)[0], x1)
    assert y1.dtype == np.int32 and len(x1) == 16


def test_datasets_shapes():
    digits = data.load("digits", 0)
    assert (digits.n_features, digits.n_classes) == (64, 10)
    x, y = digits.batch(1, 8)
    assert x.shape == (8, 64) and 0 <= x.min() and x.max() <= 1 and set(y) <= set(range(10))
    text = data.load("text", 0, seq_len=16)
    x, y = text.batch(1, 4)
    assert x.shape == y.shape == (4, 16)
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # y is x shifted by one character
    assert "".join(text.vocab[i] for i in x[0]) in data.text_corpus()
    labels = np.concatenate([data.load("synthetic", 0).batch(k, 64)[1] for k in range(1, 5)])
    assert len(set(labels)) >= 5  # the teacher uses many classes


def test_digits_are_scikit_learns_arrays_read_without_importing_it(monkeypatch, tmp_path):
    """`data.digits` reads scikit-learn's file itself (no `import sklearn`, which costs every torch rank 1.3 CPU-s):
    the same arrays as `load_digits`; a missing or damaged file, or a table of another shape, falls back to it."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    from tests import REPO

    code = "import sys; from jaxdp.core.run import data; data.load('digits', 0); print('sklearn' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          timeout=60).stdout.strip() == "False"
    ref = load_digits()
    import gzip
    import types

    (tmp_path / "datasets" / "data").mkdir(parents=True)
    (tmp_path / "datasets" / "data" / "digits.csv.gz").write_bytes(gzip.compress(b"1,2,x\n")[:-3])  # cut, not numbers
    for breaks in (None, "no file", "other shape", "damaged file"):
        data.digits.cache_clear()
        if breaks == "no file":
            monkeypatch.setattr(data.importlib.util, "find_spec", lambda name: None)
        if breaks == "damaged file":
            damaged = types.SimpleNamespace(submodule_search_locations=[str(tmp_path)])
            monkeypatch.setattr(data.importlib.util, "find_spec", lambda name, spec=damaged: spec)
        if breaks == "other shape":
            monkeypatch.setattr(data, "DIGITS_SHAPE", (1797, 66))
        pixels, labels = data.digits()
        assert pixels.dtype == np.float64 and labels.dtype == np.int32, breaks
        assert np.array_equal(pixels, ref.data) and np.array_equal(labels, ref.target), breaks
        monkeypatch.undo()
    data.digits.cache_clear()


def test_trace_round_trip_and_layout(tmp_path):
    res = run(BASE.replace(strategy="single", devices=1))
    trace.save(tmp_path / "t.npz", res.meta, res.arrays)
    t = trace.load(tmp_path / "t.npz")
    assert t.names() == ["layers/0/bias", "layers/0/kernel", "layers/1/bias", "layers/1/kernel",
                         "layers/2/bias", "layers/2/kernel"]
    assert t.arrays["init/layers/0/kernel"].shape == (32, 16)
    for k in range(1, BASE.steps + 1):
        for field in ("loss", "x", "y"):
            assert f"step/{k}/{field}" in t.arrays
        for name in t.names():
            assert f"step/{k}/grad/{name}" in t.arrays and f"step/{k}/param/{name}" in t.arrays
    assert {"framework", "strategy", "devices", "model", "data", "optimizer", "lr", "weight_decay", "clip_norm",
            "dtype", "steps", "batch_size", "accum", "seed", "versions"} <= set(t.meta)
    np.testing.assert_array_equal(t.losses(), res.losses)
    assert max(trace.diff(t, t)["worst"].values()) == 0.0


def test_truncated_trace_is_refused(tmp_path):
    res = run(BASE.replace(strategy="single", devices=1))
    trace.save(tmp_path / "t.npz", res.meta, res.arrays)
    blob = (tmp_path / "t.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(trace.TraceError, match="corrupt or truncated"):
        trace.load(tmp_path / "cut.npz")
    partial = {k: v for k, v in res.arrays.items() if not k.startswith("step/4/")}
    trace.save(tmp_path / "partial.npz", res.meta, partial)
    with pytest.raises(trace.TraceError, match="incomplete: missing step/4/loss"):
        trace.load(tmp_path / "partial.npz")


def tiny_trace(dtype=np.float32, steps=2, **meta) -> trace.Trace:
    """A hand-made two-parameter trace (as a user might write one from their own code)."""
    rng = np.random.default_rng(0)
    arrays = {"init/w": rng.standard_normal(6).astype(dtype), "init/b": np.zeros(2, dtype)}
    for k in range(1, steps + 1):
        arrays[f"step/{k}/loss"] = np.asarray(1.0 / k)
        for name in ("w", "b"):
            before = arrays[f"init/{name}" if k == 1 else f"step/{k - 1}/param/{name}"]
            grad = rng.standard_normal(before.shape).astype(dtype)
            arrays[f"step/{k}/grad/{name}"] = grad
            arrays[f"step/{k}/param/{name}"] = (before - 0.1 * grad).astype(dtype)
    return trace.Trace({"steps": steps, "dtype": {np.float64: "float64"}.get(dtype, "float32"), **meta}, arrays)


def edited(t, key, change):
    arrays = dict(t.arrays)
    arrays[key] = change(np.array(arrays[key], copy=True))
    return trace.Trace(t.meta, arrays)


def set_first(value):
    def change(a):
        a.reshape(-1)[0] = value
        return a
    return change


@pytest.mark.parametrize("key", ["step/1/loss", "step/2/grad/w", "step/1/param/b", "init/w"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_is_never_agreement(key, value):
    """max(0.0, nan) is 0.0: before issue 13 a NaN scored 0. Now every measure is inf and the key is named."""
    t = tiny_trace()
    bad = edited(t, key, set_first(value))
    for a, b, side in [(bad, t, "a"), (t, bad, "b"), (bad, bad, "a and b")]:
        d = trace.diff(a, b)
        assert d["non_finite"] == {key: side}
        assert d["per_array"][key] == d["norm"][key] == d["elementwise"][key] == d["ulp"][key] == np.inf
        assert max(d["worst"].values()) == np.inf  # so `v > tol` filters and --tolerance flag it
        assert f"NON-FINITE: {key} holds NaN or Inf in {side}" in trace.format_diff(d)


def test_elementwise_error_sees_a_small_element_that_the_relative_error_hides():
    b = np.array([1.0, 1e-13, 0.5])
    a = b * np.array([1.0, 2.0, 1.0])  # a doubled element of size 1e-13
    relative, norm, elementwise = trace.errors(a, b, floor=1e-12)
    assert relative == pytest.approx(1e-13) and norm < 1e-12
    assert elementwise == pytest.approx(0.1)  # 1e-13 against the 1e-12 floor
    assert trace.errors(a, b, floor=1e-15)[2] == pytest.approx(1.0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, "bfloat16"])
def test_ulp_distance_counts_representable_values_in_the_arrays_own_type(dtype):
    import ml_dtypes

    dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    x = np.array([1.0, -2.5, 0.0, 3e-3], dtype=dtype)
    uint = {2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize]
    up = (x.view(uint) + uint(1)).view(dtype)  # the next representable magnitude, element by element
    if dtype != ml_dtypes.bfloat16:
        np.testing.assert_array_equal(np.abs(up), np.nextafter(np.abs(x), np.inf))
    assert trace.ulp_distance(x, x) == 0
    assert trace.ulp_distance(up, x) == 1
    assert trace.ulp_distance(np.array([0.0], dtype), np.array([-0.0], dtype)) == 0  # +0 and -0
    tiny = np.array([np.finfo(np.float32).smallest_subnormal], np.float32)
    assert trace.ulp_distance(tiny, -tiny) == 2  # across zero
    assert trace.ulp_distance(x.astype(np.float64), x.astype(np.float32)) is None  # types differ


def test_updates_are_each_steps_parameter_change_and_a_wrong_step_shows_in_it():
    t = tiny_trace(np.float64, steps=3)
    ups = trace.updates(t)
    np.testing.assert_allclose(ups["update/1/w"], -0.1 * t.arrays["step/1/grad/w"])
    np.testing.assert_allclose(ups["update/3/b"], -0.1 * t.arrays["step/3/grad/b"])
    negated = edited(t, "step/3/param/w", lambda p: t.arrays["step/2/param/w"] - ups["update/3/w"])
    d = trace.diff(negated, t)
    assert d["norm"]["update/3/w"] == pytest.approx(2.0) and d["norm"]["update/2/w"] == 0
    assert d["fields"]["update"]["norm"] == pytest.approx(2.0)


def test_the_bit_for_bit_helper_refuses_identical_nans():
    from tests.helpers import assert_bitwise_equal

    x = np.array([1.0, np.nan])
    np.testing.assert_array_equal(x, x.copy())  # numpy's own check passes two NaNs
    with pytest.raises(AssertionError, match="NaN or Inf"):
        assert_bitwise_equal(x, x.copy(), "step/1/param/w")
    with pytest.raises(AssertionError, match="differs"):
        assert_bitwise_equal(np.array([0.0]), np.array([-0.0]), "k")


def test_a_no_nan_check_run_records_and_its_trace_never_agrees_even_with_itself(tmp_path, capsys):
    """--no-nan-check: the run goes on and records the non-finite values; `jaxdp diff` of that trace
    against itself exits 1, naming every non-finite array (before issue 13 it scored 0.0 and exited 0)."""
    from jaxdp.harness import cli

    res = run(BASE.replace(strategy="single", devices=1, dtype="float32", optimizer="sgd", lr=1e38, steps=3,
                           nan_check=False))
    assert not np.isfinite(res.losses[-1])
    trace.save(tmp_path / "nan.npz", res.meta, res.arrays)
    assert cli.main(["diff", str(tmp_path / "nan.npz"), str(tmp_path / "nan.npz")]) == 1
    out = capsys.readouterr().out
    assert "non-finite: step/3/loss holds NaN or Inf in A and B" in out
    assert cli.main(["diff", str(tmp_path / "nan.npz"), str(tmp_path / "nan.npz"), "--tolerance", "1e9"]) == 1
