"""Structural checks on the compiled step: the shard_map gradient trap, one sync per step whatever
the accumulation, and one all-reduce per bucket in reverse layer order."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxdp import devices, models, train
from jaxdp.strategies.bucket import MB, plan_buckets

from .conftest import BASE

COMM = {"psum", "psum_invariant", "ppermute", "all_gather", "reduce_scatter", "all_to_all", "pbroadcast"}


def test_shard_map_grad_of_replicated_params_is_already_summed():
    """The shard_map trap (docs/STRATEGIES.md), pinned: under check_vma=True, jax.grad of replicated params
    returns the psum of the local gradients; after pcast to varying it returns the local gradient."""
    n = 4
    mesh = devices.mesh(jax.devices()[:n])
    w = jnp.arange(3.0)
    x = jax.device_put(np.random.default_rng(0).standard_normal((n * 2, 3)), NamedSharding(mesh, P("data")))
    def loss(w, x):
        return jnp.mean((x @ w) ** 2)

    def grads(cast):
        def f(w, x):
            w_used = lax.pcast(w, "data", to="varying") if cast else w
            return jax.grad(loss)(w_used, x)[None]
        return np.asarray(jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P(), P("data")), out_specs=P("data")))(w, x))

    local = np.stack([jax.grad(loss)(w, np.asarray(x)[2 * i:2 * i + 2]) for i in range(n)])
    np.testing.assert_allclose(grads(cast=True), local, rtol=1e-12)
    np.testing.assert_allclose(grads(cast=False), np.broadcast_to(local.sum(0), local.shape), rtol=1e-12)


def _strategy(cfg):
    _, dataset, problem, _, strategy = train.prepare(cfg)
    state = strategy.init(problem.params)
    return problem, strategy, state, strategy.put_batch(*train.host_batch(cfg, dataset, 1))


def _collectives(jaxpr, inside_loop=False, found=None):
    """[(primitive name, inside a scan/while?)] for every collective, recursively."""
    found = [] if found is None else found
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in COMM:
            found.append((eqn.primitive.name, inside_loop))
        loop = inside_loop or eqn.primitive.name in ("scan", "while")
        for value in eqn.params.values():
            for sub in (value if isinstance(value, (tuple, list)) else [value]):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    _collectives(inner, loop, found)
    return found


@pytest.mark.parametrize("strategy", ["dp", "ddp", "ddp-bucket", "ddp-ring", "zero1", "zero2", "zero3"])
def test_accumulation_communicates_once_per_step(strategy):
    """No gradient collective inside the micro-batch loop, and K = 3 reduces exactly as K = 1 does.
    (zero3 must all-gather parameters for every micro-batch: those gathers are allowed in the loop.)"""
    comms = {}
    for accum in (1, 3):
        cfg = BASE.replace(strategy=strategy, devices=3, accum=accum, bucket_mb=0.001)
        _, s, state, batch = _strategy(cfg)
        comms[accum] = _collectives(jax.make_jaxpr(s.compiled_step)(state, *batch).jaxpr)
        if strategy == "zero3":
            comms[accum] = [c for c in comms[accum] if c[0] != "all_gather"]
    assert comms[3] == comms[1] and comms[1], comms
    assert not any(in_loop for _, in_loop in comms[3]), "a gradient collective runs inside the micro-batch loop"


def test_buckets_follow_reverse_layer_order_and_capacity():
    nbytes = {"a": 40, "b": 8, "c": 100, "d": 8, "e": 8}
    assert plan_buckets(nbytes, ["a", "b", "c", "d", "e"], 20) == [["e", "d"], ["c"], ["b"], ["a"]]
    assert plan_buckets(nbytes, ["a", "b", "c", "d", "e"], 1e9) == [["e", "d", "c", "b", "a"]]


def test_ddp_bucket_issues_one_all_reduce_per_bucket():
    cfg = BASE.replace(strategy="ddp-bucket", devices=2, bucket_mb=1200 / MB)  # 1200 bytes per bucket
    problem, s, state, batch = _strategy(cfg)
    nbytes = {k: v.size * v.dtype.itemsize for k, v in models.flat_names(problem.params).items()}
    buckets = plan_buckets(nbytes, problem.order, cfg.bucket_mb * MB)
    assert len(buckets) >= 3 and buckets[0][0] == "layers/2/bias"
    psums = [
        name
        for name, _ in _collectives(jax.make_jaxpr(s.compiled_step)(state, *batch).jaxpr)
        if name.startswith("psum")
    ]
    assert len(psums) == len(buckets) + 1  # + the loss, averaged for the log
