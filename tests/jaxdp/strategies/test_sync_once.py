"""Structural checks on the compiled (post-optimisation) step, read from its HLO text: the shard_map
gradient trap, no gradient collective inside the micro-batch loop, one all-reduce per bucket in
reverse layer order, the ring's 2(N-1) collective-permutes, and dp's update on device 0 only.
A jaxpr can hold what XLA later merges or reorders, so every count here is taken on the program
that runs (`accounting.collectives`, `hlo.computations`)."""
from __future__ import annotations

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxdp import devices, models, train
from jaxdp.analysis import accounting, hlo
from jaxdp.strategies import bucket
from jaxdp.strategies.bucket import MB, plan_buckets
from tests.conftest import BASE

# A concatenate of floating-point arrays: how ravel_pytree / jnp.concatenate pack gradients, which
# XLA:CPU compiles into a loop fusion measured at 10-100x a copy of the same bytes (collectives.pack).
FLOAT_CONCATENATE = re.compile(r"= (f16|bf16|f32|f64)\[[\d,]+\]\S* concatenate\(")
COMM = {"psum", "psum_invariant", "ppermute", "all_gather", "reduce_scatter", "all_to_all", "pbroadcast"}


def test_shard_map_grad_of_replicated_params_is_already_summed():
    """The trap DESIGN.md warns about, pinned: under check_vma=True, jax.grad of replicated params
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


@functools.cache
def compiled(cfg) -> tuple[models.Problem, str]:
    """(problem, the compiled training step's HLO text) for `cfg`, once per session."""
    problem, s, state, batch = _strategy(cfg)
    return problem, s.compiled_step.lower(state, *batch).compile().as_text()


def _collectives(jaxpr, inside_loop=False, found=None):
    """[(primitive name, inside a scan/while?)] for every collective of a jaxpr, recursively (kept
    for tests/jaxdp/strategies/zero/test_zero.py; the checks in this file read the compiled program instead)."""
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
    """In the compiled step, no collective runs inside the micro-batch loop (a while whose body
    runs accum - 1 = 2 times), and K = 3 communicates exactly what K = 1 does. zero3 all-gathers
    parameters for every micro-batch: those gathers alone may sit in the loop."""
    def comms(accum):
        cfg = BASE.replace(strategy=strategy, devices=3, accum=accum, bucket_mb=0.001)
        found = accounting.collectives(compiled(cfg)[1], 3)
        return [c for c in found if not (strategy == "zero3" and c["op"] == "all-gather")]

    one, three = comms(1), comms(3)
    in_loop = [(c["op"], c["elements"]) for c in three if c["trips"] != 1]
    assert not in_loop, f"{strategy}: collectives inside the micro-batch loop: {in_loop}"
    assert one and sorted((c["op"], c["elements"]) for c in three) == sorted((c["op"], c["elements"]) for c in one)


def test_the_edge_between_buckets_leaves_every_value_as_it_was():
    """`bucket.after(x, done)` orders a bucket's collective behind the previous one by adding a zero that
    depends on it: that zero must be -0.0, the identity of IEEE addition. A +0.0 turned a gradient's -0.0
    into +0.0 before the canonical tree, where `single` (no edge) keeps -0.0 (a product with a zero).
    (Subnormals are left out: XLA:CPU flushes them in every add, the tree's own included.)"""
    x = jnp.array([-0.0, 0.0, 1.5, -2.0, jnp.inf, -jnp.inf, jnp.nan, 3e-38], jnp.float32)
    for done in (jnp.array([1.0]), jnp.array([-1.0]), jnp.array([jnp.nan])):
        got = np.asarray(jax.jit(bucket.after)(x, done))
        assert np.array_equal(got.view(np.uint32), np.asarray(x).view(np.uint32)), (done, got)


def test_buckets_follow_reverse_layer_order_and_capacity():
    nbytes = {"a": 40, "b": 8, "c": 100, "d": 8, "e": 8}
    assert plan_buckets(nbytes, ["a", "b", "c", "d", "e"], 20) == [["e", "d"], ["c"], ["b"], ["a"]]
    assert plan_buckets(nbytes, ["a", "b", "c", "d", "e"], 1e9) == [["e", "d", "c", "b", "a"]]


# bucket capacities (bytes) giving the float64 mlp of BASE 6 buckets (one per parameter), 3 buckets
# (several parameters each), and 1 bucket
@pytest.mark.parametrize("capacity, n_buckets", [(1200, 6), (2200, 3), (1e9, 1)])
@pytest.mark.parametrize("n, accum", [(2, 1), (3, 3), (4, 1)])
def test_ddp_bucket_compiles_to_one_all_reduce_per_bucket_in_reverse_order(capacity, n_buckets, n, accum):
    """The compiled step holds one all-reduce per planned bucket, of the bucket's size, in the order
    the plan reduces them (last layer first), once per step, plus the loss's scalar all-reduce on
    its own: nothing merged (XLA's combiners), nothing reordered (its scheduler)."""
    cfg = BASE.replace(strategy="ddp-bucket", devices=n, accum=accum, bucket_mb=capacity / MB)
    problem, text = compiled(cfg)
    named = models.flat_names(problem.params)
    buckets = bucket.plan(problem, cfg.bucket_mb)
    planned = [sum(named[name].size for name in b) for b in buckets]
    assert len(planned) == n_buckets and buckets[0][0] == "layers/2/bias"
    reduces = [c for c in accounting.collectives(text, n) if c["op"] != "collective-permute"]
    assert all(c["op"] == "all-reduce" and c["trips"] == 1 for c in reduces), reduces
    assert [c["elements"] for c in reduces if c["elements"] > 1] == planned
    assert [c["elements"] for c in reduces if c["elements"] == 1] == [1]  # the loss, alone
    assert not FLOAT_CONCATENATE.search(text), "gradients packed by a concatenate fusion (slow on XLA:CPU)"


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ddp_ring_compiles_to_2_n_minus_1_permutes_of_one_chunk(n):
    """ddp-ring's step: 2(N-1) collective-permutes, each of one chunk (ceil(Psi / N) elements) sent
    around the ring i -> i+1, and no all-reduce but the loss's scalar."""
    problem, text = compiled(BASE.replace(strategy="ddp-ring", devices=n))
    psi = sum(p.size for p in jax.tree.leaves(problem.params))
    found = accounting.collectives(text, n)
    permutes = [c for c in found if c["op"] == "collective-permute"]
    assert len(permutes) == 2 * (n - 1)
    assert all(c["elements"] == math.ceil(psi / n) and c["trips"] == 1 for c in permutes)
    assert all(sorted(c["pairs"]) == [(i, (i + 1) % n) for i in range(n)] for c in permutes)
    assert [(c["op"], c["elements"]) for c in found if c["op"] != "collective-permute"] == [("all-reduce", 1)]
    assert not FLOAT_CONCATENATE.search(text), "gradients packed by a concatenate fusion (slow on XLA:CPU)"


def _defining_line(lines: list[str], name: str) -> str:
    return next(line for line in lines if re.match(rf"\s*(ROOT )?%{re.escape(name)} = ", line))


def _opcodes(lines: list[str]) -> set[str]:
    return {m.group(1) for line in lines if (m := re.search(r"= [^=]*?\s([a-z][a-z-]*)\(", line))}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_dp_updates_on_device_0_only(optimizer):
    """In dp's compiled step the optimizer runs inside a `conditional` whose branch index is computed
    from the device index alone (partition-id == 0); the branch the other devices take passes its
    operands through (no arithmetic), the other holds the update."""
    _, text = compiled(BASE.replace(strategy="dp", devices=4, optimizer=optimizer))
    entry, comps = hlo.computations(text)
    conds = [line for line in comps[entry] if " conditional(" in line]
    assert len(conds) == 1, f"expected the update in one conditional, found {len(conds)}"
    index = re.search(r" conditional\(%([^,\s)]+)", conds[0]).group(1)
    index_line = _defining_line(comps[entry], index)
    operands = re.findall(r"%([^\s,)]+)", index_line.split("(", 1)[1].split(")")[0])
    assert all("partition-id()" in _defining_line(comps[entry], o) for o in operands), index_line
    called = re.search(r"calls=%([^\s,]+)", index_line)
    body = comps[called.group(1)] if called else [index_line]
    assert any("direction=EQ" in line for line in body) and any("constant(0)" in line for line in body), body
    other, server = re.search(r"branch_computations=\{%([^,]+), %([^}]+)\}", conds[0]).groups()
    assert _opcodes(comps[other]) <= {"parameter", "get-tuple-element", "tuple", "copy", "bitcast"}, comps[other]
    assert "fusion" in _opcodes(comps[server]) or {"multiply", "subtract", "add"} & _opcodes(comps[server])
