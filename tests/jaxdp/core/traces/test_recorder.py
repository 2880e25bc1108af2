"""`jaxdp.trace.Recorder`: the trace written from a user's loop (names, layouts, atomic write on a
clean exit, nothing on an exception). `jaxdp train` records through it too (tests/jaxdp/strategies/test_strategies.py
and the parity suites read its traces)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp.core.errors import ConfigError
from jaxdp.core.traces import trace
from jaxdp.models import flat_names

PARAMS = {"layers": {0: {"kernel": np.arange(6.0).reshape(2, 3), "bias": np.ones(3)}}, "scale": np.float64(2.0)}
STATS = {"bn": {"mean": np.zeros(3), "var": np.ones(3)}}


def record(path, params=PARAMS, grads=PARAMS, steps=(1, 2), meta=None):
    with trace.Recorder(path, meta or {"framework": "jax", "model": "mine"}) as rec:
        rec.init(params, state=STATS)
        for k in steps:
            rec.step(k, 0.5 / k, grads, params, x=np.full((4, 2), k), y=np.arange(4), state=STATS)
    return rec


def test_nested_flat_and_jax_values_give_the_same_trace(tmp_path):
    """Nested dicts (named as jaxdp.models.flat_names names them), a flat name dict and jax arrays
    are the same trace."""
    nested = record(tmp_path / "a.npz")
    flat = record(tmp_path / "b.npz", params=flat_names(PARAMS), grads={k: jnp.asarray(v) for k, v in
                                                                       flat_names(PARAMS).items()})
    assert set(nested.arrays) == set(flat.arrays)
    for k, v in nested.arrays.items():
        np.testing.assert_array_equal(v, flat.arrays[k])
    names = set(flat_names(PARAMS))
    assert {k[len("init/"):] for k in nested.arrays if k.startswith("init/")} == names
    assert {"state/bn/mean", "step/2/state/bn/var", "step/1/x", "step/2/y", "step/1/grad/layers/0/kernel"} <= set(
        nested.arrays)


def test_written_on_close_and_read_back_with_steps_filled_in(tmp_path):
    record(tmp_path / "t.npz", steps=(3, 4, 5))
    t = trace.load(tmp_path / "t.npz")
    assert (t.first_step, t.steps, t.meta["model"]) == (3, 5, "mine")
    np.testing.assert_allclose(t.losses(), [0.5 / 3, 0.5 / 4, 0.1])
    assert trace.diff(t, t)["worst"]["param"] == 0.0


def test_an_exception_in_the_block_writes_nothing_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "t.npz"
    record(path)
    before = path.read_bytes()
    with pytest.raises(RuntimeError, match="diverged"), trace.Recorder(path, {"model": "other"}) as rec:
        rec.init(PARAMS)
        rec.step(1, 0.1, PARAMS, PARAMS)
        raise RuntimeError("diverged")
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["t.npz"]


def test_steps_out_of_order_are_refused():
    rec = trace.Recorder(None, {})
    rec.step(2, 0.1, None, PARAMS)
    with pytest.raises(ValueError, match="step 2 recorded after step 2; record steps in increasing order"):
        rec.step(2, 0.1, None, PARAMS)


def test_an_nnx_state_is_recorded_as_its_arrays():
    """`rec.init(nnx.state(model, nnx.Param))`: a State of Variables, recorded as the arrays they hold."""
    from flax import nnx

    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    rec = trace.Recorder(None, {})
    rec.init(nnx.state(model, nnx.Param))
    assert set(rec.arrays) == {"init/kernel", "init/bias"}
    np.testing.assert_array_equal(rec.arrays["init/kernel"], np.asarray(model.kernel[...]))


def test_the_optimizer_settings_go_into_meta_and_a_clash_or_an_optax_object_is_one_line():
    rec = trace.Recorder(None, {"model": "mine"}, optimizer={"name": "adamw", "lr": 1e-3, "weight_decay": 0.01,
                                                             "clip_norm": 1.0})
    assert rec.meta == {"model": "mine", "optimizer": "adamw", "lr": 1e-3, "weight_decay": 0.01, "clip_norm": 1.0}
    assert trace.Recorder(None, {"lr": 1e-3}, optimizer={"name": "sgd", "lr": 1e-3}).meta["optimizer"] == "sgd"
    with pytest.raises(ConfigError, match="weight_decay 0.0 in meta, 0.01 in the optimizer"):
        trace.Recorder(None, {"weight_decay": 0.0}, optimizer={"name": "adamw", "lr": 1e-3, "weight_decay": 0.01})
    with pytest.raises(ConfigError, match="give a dict of its settings") as e:
        trace.Recorder(None, {}, optimizer=lambda params: None)  # what optax's transformations expose: nothing
    assert "\n" not in str(e.value)
