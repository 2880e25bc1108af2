"""Non-finite state is never recorded or checkpointed (strategies/finite.py, torch_ref/strategies/finite.py): a
NaN or Inf gradient with a finite loss, planted on one device's rows only (so that under ZeRO it lands in one
shard), is flagged inside every JAX strategy's compiled step and named on the host; `jaxdp train` and
`python -m torch_ref train` stop with the step and the tensor, exit 3, and keep no checkpoint of that step.
Before: only the loss was read, and the poisoned state was applied, recorded and checkpointed (exit 0)."""
from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxdp
from jaxdp import models
from jaxdp.harness import cli
from jaxdp.strategies import FACTORIES
from jaxdp.strategies.finite import nonfinite_names
from tests import REPO

REPO = REPO
PARAMS = {"b": np.zeros((2,), np.float32), "w": np.ones((4, 3), np.float32)}
Y = np.zeros((8, 3), np.float32)


def loss_fn(p, x, y):
    """Rows whose x[:, 0] is 0 add sqrt(b[1] + 0): value 0, gradient Inf; other rows a finite gradient."""
    return jnp.mean((x @ p["w"] - y) ** 2) + jnp.mean(jnp.sqrt(p["b"][1] + x[:, 0]))


def batch(poisoned: bool) -> np.ndarray:
    x = np.ones((8, 4), np.float32)
    x[4:, 0] = 0.0 if poisoned else 1.0  # the second device's rows (of 2)
    return x


@pytest.mark.parametrize("name", [*FACTORIES, "fsdp-jit explicit"])
def test_every_strategy_flags_a_nonfinite_gradient_with_a_finite_loss(name):
    strategy, *explicit = name.split()
    par = jaxdp.parallelize(loss_fn, PARAMS, optax.sgd(0.1), strategy=strategy, devices=1 if name == "single" else 2,
                            **({"axis_type": "explicit"} if explicit else {}))
    _, honest = par.step(par.init(), batch(False), Y)
    assert nonfinite_names(honest["finite"], PARAMS) == []
    _, metrics = par.step(par.init(), batch(True), Y)
    assert np.isfinite(float(metrics["loss"]))
    assert nonfinite_names(metrics["finite"], PARAMS) == ["gradient b", "parameter b"]


def test_the_check_can_be_turned_off():
    par = jaxdp.parallelize(loss_fn, PARAMS, optax.sgd(0.1), strategy="ddp", devices=2, nan_check=False)
    assert "finite" not in par.step(par.init(), batch(True), Y)[1]


CROSS_ENTROPY = models.cross_entropy


def poisoned_cross_entropy(outputs, y):
    """A finite loss whose gradient is NaN: sqrt at 0 (value 0, derivative Inf) times a zero derivative."""
    return CROSS_ENTROPY(outputs, y) + jnp.sqrt(outputs[0, 0] - jax.lax.stop_gradient(outputs[0, 0]))


def test_jaxdp_train_stops_before_recording_or_checkpointing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(models, "cross_entropy", poisoned_cross_entropy)
    folder, path = tmp_path / "ck", tmp_path / "t.npz"
    code = cli.main(["train", "--strategy", "zero2", "--devices", "2", "--steps", "3", "--hidden", "8,8",
                     "--batch-size", "8", "--dtype", "float32", "--checkpoint-dir", str(folder),
                     "--checkpoint-every", "1", "--trace", str(path)])
    err = capsys.readouterr().err
    assert code == 3, err
    assert err.startswith("jaxdp: error: gradient layers/0/bias holds NaN or Inf at step 1 (and ")
    assert "the loss" in err and "finite; nothing of step 1 recorded or checkpointed" in err
    assert not path.exists() and not any(p.name.isdigit() for p in folder.glob("*"))


def test_torch_ref_train_stops_before_the_step_in_a_sharded_strategy(tmp_path):
    """zero2 on 2 ranks: rank 1's rows alone make the Inf, which then lives in one rank's shard only; the
    all-reduced flag stops both ranks before optimizer.step() of step 2: the checkpoint of step 1 stays alone."""
    folder = tmp_path / "ck"  # `python -m torch_ref train ...` with the fault put in by tests/torch_faults.py
    out = subprocess.run([sys.executable, "-m", "tests.torch_faults", "inf", "1:2", "train", "--strategy", "zero2",
                          "--devices", "2", "--steps", "3", "--hidden", "8,8", "--batch-size", "8", "--dtype",
                          "float32", "--checkpoint-dir", str(folder), "--checkpoint-every", "1"],
                         capture_output=True, text=True, timeout=180, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 3, out.stderr[-2000:]
    assert "gradient (flat shard 0 of the optimizer) holds NaN or Inf at step 2; nothing of step 2" in out.stderr
    assert sorted(p.name for p in folder.iterdir() if p.name.isdigit()) == ["1"]
