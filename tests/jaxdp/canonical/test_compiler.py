"""Canonical's compiler options (jaxdp/canonical/compiler.py, docs/CANONICAL.md "The simplifier on"): the
simplifier stays on unless some scalar of the optimizer's update reaches the parameters through one broadcast
alone, on the true shapes or on ZeRO's flat layout; read from the update's jaxpr, so a user's optimizer is read
as it is. End to end (tests/canonical_optax.py, a process started for canonical): a `multi_transform` whose
bias group has two leaves of one padded length keeps every strategy bitwise equal to `single`, and with the
simplifier forced on it does not (the check is needed, and it can fail)."""
from __future__ import annotations

import json
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest

from jaxdp.canonical import compiler
from tests import REPO


def shapes(*dims):
    return {f"p{i}": jax.ShapeDtypeStruct(d, np.float32) for i, d in enumerate(dims)}


@pytest.mark.parametrize(("params", "optimizer", "on"), [
    (shapes((12, 16), (16,), (16, 10), (10,)), optax.adamw(1e-3), True),  # several lengths and shapes
    (shapes((2,), (3,), (3, 3, 1, 2)), optax.adamw(1e-3), False),  # one padded length (64), several shapes
    (shapes((8, 8), (8, 8)), optax.adam(1e-3), False),  # one shape: one broadcast everywhere
    (shapes((12, 16), (16,), (16, 10), (10,)), optax.sgd(1e-2, momentum=0.9), True),  # no per-step scalar
    (shapes((12, 16), (16,), (16, 10), (10,)), optax.adam(optax.cosine_decay_schedule(1e-3, 100)), True),
    (shapes((2,), (3,)), None, True),  # a forward-only program
])
def test_the_simplifier_is_off_where_a_scalar_has_a_lone_broadcast(params, optimizer, on):
    want = compiler.COMPILER_OPTIONS if on else compiler.UNSIMPLIFIED
    assert compiler.compiler_options(params, optimizer) == want


def test_an_update_that_cannot_be_read_keeps_the_simplifier_off():
    def update(grads, state, params, *, extra):  # an update that needs an argument of its own
        return grads, state
    opt = optax.GradientTransformation(lambda params: optax.EmptyState(), update)
    assert compiler.compiler_options(shapes((12, 16), (16,)), opt) == compiler.UNSIMPLIFIED


def test_a_group_of_one_padded_length_keeps_the_simplifier_off():
    params = shapes((12, 16), (16,), (16, 10), (10,))
    labels = {"p0": "k", "p1": "b", "p2": "k", "p3": "b"}
    opt = optax.multi_transform({"b": optax.adam(0.05), "k": optax.adamw(0.01)}, labels)
    assert compiler.compiler_options(params, opt) == compiler.UNSIMPLIFIED
    assert compiler.compiler_options(params, optax.adamw(0.01)) == compiler.COMPILER_OPTIONS


@pytest.mark.parametrize("mutation", [None, "--simplifier-on"])
def test_a_users_optimizer_keeps_the_bits_and_the_check_is_needed(mutation):
    cmd = [sys.executable, "-m", "tests.canonical_optax", *([mutation] if mutation else [])]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout.splitlines()[-1])
    unequal = {k: v for k, v in row["differ"].items() if v}
    if mutation:
        assert unequal, row  # the simplifier on: some layout differs from single
    else:
        assert row["options"] == compiler.UNSIMPLIFIED and not unequal, row
