"""Data is a pure function of (seed, step); the trace round-trips and refuses what it cannot read."""
from __future__ import annotations

import numpy as np
import pytest

from jaxdp import data, trace

from .conftest import BASE, run


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
