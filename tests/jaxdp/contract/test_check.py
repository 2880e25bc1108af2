"""`jaxdp.check` on plain JAX programs as users write them: each seeded misconfiguration (seeded_jax.CASES,
with its public source) caught with its kind, first; the same programs with the mistake undone, and every
strategy of the project compiled through `jaxdp.parallelize`, pass."""
from __future__ import annotations

import functools

import jax
import numpy as np
import optax
import pytest

import jaxdp
from jaxdp.contract import strategies as contract_strategies
from jaxdp.core.errors import ConfigError
from jaxdp.core.registry import strategies as registry
from jaxdp.core.run.config import JIT_STRATEGIES

from . import seeded_jax


@functools.cache
def reported(build, **intent):
    fn, args = build(jax.devices())
    return jaxdp.check(fn, *args, **intent)


@pytest.mark.parametrize("name", sorted(seeded_jax.CASES))
def test_a_seeded_misconfiguration_is_caught_with_its_kind(name):
    build, intent, kind, source = seeded_jax.CASES[name]
    r = reported(build, **intent)
    assert not r.ok and r.findings[0].kind == kind, (source, r.to_text())
    assert all(f.message and f.fix for f in r.findings)


@pytest.mark.parametrize("name", sorted(seeded_jax.HONEST))
def test_the_same_program_with_the_mistake_undone_passes(name):
    build, intent = seeded_jax.HONEST[name]
    r = reported(build, **intent)
    assert r.ok, r.to_text()


@pytest.mark.quick
def test_the_report_reads_each_collective():
    """ddp: one all-reduce of the P gradient elements, f32, over 'data' (4), once per step; the CPU runs it
    synchronously, so its overlap is unknown, not 'no'."""
    r = reported(seeded_jax.ddp, intent="ddp")
    (c,) = r.comms
    p = r.facts["param_elements"]
    assert (c.op, c.dtype, c.elements, c.bytes, c.axis, c.group, c.count, c.overlaps) == (
        "all-reduce", "f32", p, 4 * p, "data", 4, 1, None)
    assert r.to_dict()["ok"] is True and '"collectives"' in r.to_json()
    assert "OK: the program communicates as ddp intends" in r.to_text()


@pytest.mark.quick
def test_bad_intent_is_one_line_naming_the_fix():
    fn, args = seeded_jax.ddp(jax.devices())
    with pytest.raises(ConfigError, match="--intent 'fsdp' is not a data-parallel layout; use one of ddp, zero1"):
        jaxdp.check(fn, *args, intent="fsdp")
    with pytest.raises(ConfigError, match="--reduce-dtype 'fp32' is not a dtype"):
        jaxdp.check(fn, *args, reduce_dtype="fp32")


X = np.random.default_rng(0).normal(size=(16, seeded_jax.F)).astype(np.float32)
Y = (np.arange(16) % seeded_jax.C).astype(np.int32)
PROJECT = [(s, k) for s in registry.names("jax", oracle="single") for k in (1, 2)]


def project(strategy: str, accum: int, **options):
    kw = {"replicas": 2} if strategy == "hsdp" else {}
    par = jaxdp.parallelize(seeded_jax.loss_fn, seeded_jax.init_params(), optax.adamw(1e-3, weight_decay=0.01),
                            strategy=strategy, devices=1 if strategy == "single" else 4, accum=accum, **kw, **options)
    return contract_strategies.of_parallel(par, par.init(), X, Y)


@pytest.mark.parametrize("strategy,accum", PROJECT, ids=lambda v: str(v))
def test_every_project_strategy_keeps_its_contract(strategy, accum):
    """The -jit strategies' default mesh (axis_type auto) all-reduces the gradient once per micro-batch
    (docs/STRATEGIES.md): with accumulation their contract is checked on the explicit mesh, and the auto one
    is the next test's."""
    options = {"axis_type": "explicit"} if strategy in JIT_STRATEGIES and accum > 1 else {}
    r = project(strategy, accum, **options)
    assert r.ok, r.to_text()


@pytest.mark.parametrize("strategy", JIT_STRATEGIES)
def test_the_jit_strategies_auto_mesh_reduces_every_micro_batch(strategy):
    """What docs/STRATEGIES.md states of axis_type auto (MaxText's finding), read by the check in its terms."""
    r = project(strategy, 2, axis_type="auto")
    assert "sync-per-microbatch" in [f.kind for f in r.findings], r.to_text()
