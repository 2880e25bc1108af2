"""The hand-written collectives against XLA's built-ins, for N = 1..8 and sizes not divisible by N,
and the bytes they send read from the compiled program."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxdp import collectives, devices
from jaxdp.analysis import accounting
from jaxdp.harness.bench.collectives import OPS, collectives_benchmark

SIZES = [1, 5, 12, 17]
NS = [1, 2, 3, 4, 8]


def per_device(fn, n, x, check_vma=False):
    """Run fn on each device's row of x ([n, ...]); returns the stacked per-device results."""
    mesh = devices.mesh(jax.devices()[:n])
    f = jax.shard_map(lambda row: fn(row[0])[None], mesh=mesh, in_specs=P("data"), out_specs=P("data"),
                      check_vma=check_vma)
    return np.asarray(jax.jit(f)(jax.device_put(x, NamedSharding(mesh, P("data")))))


def rows(n, size, seed=0):
    return np.random.default_rng([n, size, seed]).standard_normal((n, size))


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("size", SIZES)
def test_ring_all_reduce_equals_psum(n, size):
    x = rows(n, size)
    ring = per_device(lambda v: collectives.ring_all_reduce(v, "data"), n, x)
    ref = per_device(lambda v: lax.psum(v, "data"), n, x, check_vma=True)
    np.testing.assert_allclose(ring, ref, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(ring[0], x.sum(0), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("size", SIZES)
def test_ring_reduce_scatter_equals_psum_scatter(n, size):
    x = rows(n, size)
    ring = per_device(lambda v: collectives.ring_reduce_scatter(v, "data"), n, x)
    ref = per_device(lambda v: lax.psum_scatter(collectives.pad_to_multiple(v, n), "data", tiled=True), n, x,
                     check_vma=True)
    assert ring.shape == (n, -(-size // n))
    np.testing.assert_allclose(ring, ref, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("size", [1, 3, 4])
def test_ring_all_gather_equals_all_gather(n, size):
    x = rows(n, size)
    ring = per_device(lambda v: collectives.ring_all_gather(v, "data"), n, x)
    ref = per_device(lambda v: lax.all_gather(v, "data", tiled=True), n, x, check_vma=True)
    np.testing.assert_array_equal(ring, ref)  # a gather moves bits: exact


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_reduce_to_root_and_broadcast_from_root(n):
    x = rows(n, 7)
    reduced = per_device(lambda v: collectives.reduce_to_root(v, "data"), n, x)
    np.testing.assert_allclose(reduced[0], x.sum(0), rtol=1e-13)
    broadcast = per_device(lambda v: collectives.broadcast_from_root(v, "data"), n, x)
    np.testing.assert_array_equal(broadcast, np.broadcast_to(x[0], x.shape))


# What the compiled ring may do to arrays: move them (collective-permute, slices, updates, pads,
# copies, bitcasts), zero-fill the buffer it gathers into (broadcast), and add the chunks it
# reduces. No scatter, gather, select or concatenate.
COPY_ONLY = {"parameter", "collective-permute", "dynamic-slice", "slice", "dynamic-update-slice", "pad", "copy",
             "bitcast", "reshape", "fusion", "tuple", "get-tuple-element", "add", "broadcast"}
RING = {"all_reduce": collectives.ring_all_reduce, "reduce_scatter": collectives.ring_reduce_scatter,
        "all_gather": collectives.ring_all_gather}


def compiled_ring(fn, n: int, size: int) -> str:
    mesh = devices.mesh(jax.devices()[:n])
    f = jax.shard_map(lambda v: fn(v, "data"), mesh=mesh, in_specs=P("data"), out_specs=P("data"), check_vma=False)
    x = jax.device_put(jnp.zeros(n * size, jnp.float32), NamedSharding(mesh, P("data")))
    return jax.jit(f).lower(x).compile().as_text()


def array_opcodes(hlo_text: str) -> set[str]:
    """Opcodes of every instruction, in every computation (fused ones too), whose result is an array
    with at least one dimension (scalar index arithmetic is left out)."""
    return set(re.findall(r"= \(?[a-z0-9]+\[\d[\d,]*\][^ ]* ([a-z][a-z-]*)\(", hlo_text))


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("size", [1001, 1024])
def test_compiled_ring_all_reduce_is_2_n_minus_1_permutes_of_one_chunk(n, size):
    """The compiled all-reduce: 2(N-1) collective-permutes i -> i+1, each of one chunk of
    ceil(size/N) elements, once each."""
    found = accounting.collectives(compiled_ring(collectives.ring_all_reduce, n, size), n)
    assert [c["op"] for c in found] == ["collective-permute"] * (2 * (n - 1))
    assert all(c["elements"] == -(-size // n) and c["trips"] == 1 for c in found)
    assert all(sorted(c["pairs"]) == [(i, (i + 1) % n) for i in range(n)] for c in found)


@pytest.mark.parametrize("op", list(RING))
@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("size", [1001, 1024])
def test_compiled_ring_is_copy_only(op, n, size):
    """On arrays, the compiled ring only moves data and adds chunks: no scatter (what
    `.at[traced index].set` becomes), gather, select or concatenate."""
    ops = array_opcodes(compiled_ring(RING[op], n, size))
    assert "collective-permute" in ops and ops <= COPY_ONLY, ops


@pytest.mark.parametrize("size", [None, 40])
def test_pack_is_concatenate_and_pad_and_unpack_inverts_it(size):
    arrays = [jnp.arange(6.0).reshape(2, 3), jnp.ones(5), jnp.full((3, 1), 7.0)]
    ref = np.concatenate([np.asarray(a).reshape(-1) for a in arrays])
    flat = np.asarray(jax.jit(lambda *a: collectives.pack(a, size))(*arrays))
    np.testing.assert_array_equal(flat, np.pad(ref, (0, 0 if size is None else size - ref.size)))
    for a, b in zip(collectives.unpack(jnp.asarray(flat), arrays), arrays, strict=True):
        np.testing.assert_array_equal(a, b)


def test_collectives_benchmark_runs_every_op_size_and_n():
    """A smoke run of the micro-benchmark (tiny sizes): one row per op, size and N; times positive."""
    rows = collectives_benchmark(sizes_mb=(0.01,), ns=(2, 3), repeats=1)
    assert [(r["op"], r["devices"]) for r in rows] == [(op, n) for n in (2, 3) for op in OPS]
    assert all(r["ring_ms"] > 0 and r["xla_ms"] > 0 and r["ratio"] > 0 for r in rows)
