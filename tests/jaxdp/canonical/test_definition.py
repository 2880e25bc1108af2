"""The canonical reduction's definition in JAX, op by op (the twin of tests/torch_ref/canonical/
test_torch_canonical.py's): the tree pairs adjacent leaves level by level, `pairsum` zero-pads to a power
of two first, `blocks` lays a flat array out as BLOCKS rows. Eager float32, in this process (the compiled
runs' bits: test_canonical.py, in a child process)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp import canonical


def test_tree_pairs_adjacent_leaves_level_by_level():
    leaves = np.array([1e8, 1.0, -1e8, 1.0, 3.0, 5.0, 7.0, 11.0], dtype=np.float32)
    a, b, c, d, e, f, g, h = leaves
    expected = ((a + b) + (c + d)) + ((e + f) + (g + h))
    fold = np.float32(0)
    for x in leaves:
        fold = np.float32(fold + x)
    assert float(canonical.tree(jnp.asarray(leaves))) == float(expected) != float(fold)


def test_pairsum_pads_to_a_power_of_two_and_blocks_are_the_rows():
    v = jnp.asarray(np.arange(1, 6, dtype=np.float32)[None])  # width 5: padded to 8
    assert float(canonical.pairsum(v)[0]) == ((1 + 2) + (3 + 4)) + 5
    flat = jnp.arange(canonical.BLOCKS + 1, dtype=jnp.float32)
    rows = canonical.blocks(flat)
    assert rows.shape == (canonical.BLOCKS, 2) and float(rows.sum()) == float(flat.sum())


def test_the_canonical_step_runs_in_a_fresh_process(tmp_path):
    """`canonical.step` (the shard program, the partials, the step's values) through `jaxdp train
    --reduction canonical` (a fresh process: canonical sets XLA's flags before JAX starts); the compiled
    runs' bits across N are test_canonical.py's."""
    import subprocess
    import sys
    out = tmp_path / "t.npz"
    cmd = [sys.executable, "-m", "jaxdp", "train", "--strategy", "ddp", "--devices", "2", "--reduction", "canonical",
           "--steps", "1", "--hidden", "8", "--batch-size", "8", "--shards", "2", "--trace", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert np.isfinite(np.load(out)["step/1/loss"]).all()


@pytest.mark.parametrize("paired", [False, True], ids=["scans", "paired"])
def test_streamed_tree_is_the_tree_bit_for_bit(monkeypatch, paired):
    """`streamed_tree` (a device's shards added as they finish, nested scans from -0.0; a large gradient's
    lowest level as unrolled pairs, `PAIRED_BYTES`) has the tree's association: the same bits as stacking
    the leaves and `tree`, and not a left fold's."""
    import jax

    monkeypatch.setattr(canonical.reduce, "PAIRED_BYTES", 0 if paired else 1 << 62)
    rng = np.random.default_rng(0)
    for k in (1, 2, 4, 8):
        leaves = (rng.standard_normal((k, 5)) * 10.0 ** rng.integers(-8, 8, (k, 5))).astype(np.float32)
        leaves[:, 0] = -0.0  # -0.0 + -0.0 stays -0.0: the carry's start is the identity
        leaves[:, 1] = np.resize(np.array([1e8, 1.0, -1e8, 1.0], np.float32), k)  # tree 0, a left fold 1
        stacked = (jnp.asarray(leaves), jnp.asarray(leaves[:, 1]))
        like = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), stacked)
        program = jax.jit(lambda s, k=k, like=like: canonical.streamed_tree(
            lambda i: jax.tree.map(lambda a: a[i], s), k, like))
        got = program(stacked)
        want = canonical.tree(stacked)
        assert all(np.array_equal(np.asarray(g), np.asarray(w)) for g, w in zip(got, want, strict=True))
        assert np.signbit(np.asarray(got[0])[0])
        levels = k.bit_length() - 1  # one scan per level (nested); the pairs' level unrolled
        scans = program.lower(stacked).as_text().count("stablehlo.while")
        assert scans == (max(levels - 1, 0) if paired else levels), (k, scans)
        if k >= 4:
            fold = leaves[0].copy()
            for row in leaves[1:]:
                fold = fold + row
            assert not np.array_equal(np.asarray(got[0]), fold)


def test_the_packed_vector_is_padded_as_it_is_packed():
    """`all_reduce_tree` packs its leaves straight into a vector of a multiple of N elements: padding it after
    packing (`jnp.pad`) copied the whole vector once more in zero1's and ddp-ring's steps (docs/CANONICAL.md,
    "Cost"). 1001 elements on 4 devices: the compiled program has no pad of its own."""
    import jax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    leaves = {"w": jnp.ones((4, 10, 100)), "b": jnp.ones((4, 1))}
    body = jax.shard_map(lambda t: canonical.all_reduce_tree(jax.tree.map(lambda a: a[0], t), "d"), mesh=mesh,
                         in_specs=P("d"), out_specs=P(), check_vma=False)
    hlo = jax.jit(body).lower(leaves).compile().as_text()
    assert "jit(_pad)" not in hlo and "all_to_all" in hlo


def _four_devices_values(shape):
    """[4, *shape] float32 values whose sum over the leading axis depends on the association: the tree's
    ((1e8 + 1) + (-1e8 + 1)) is 0, a left fold's 1 (and scaled rows elsewhere)."""
    rng = np.random.default_rng(1)
    v = (rng.standard_normal((4, *shape)) * 10.0 ** rng.integers(-6, 6, (4, *shape))).astype(np.float32)
    v.reshape(4, -1)[:, ::7] = np.array([1e8, 1.0, -1e8, 1.0], np.float32)[:, None]
    return v


def test_large_leaves_alone_and_in_pieces_give_the_trees_bits():
    """`all_reduce_tree` reduces a leaf of at least ALONE_BYTES on its own (no copy into the pack) and
    `combine_scatter` exchanges it in PIECES pieces, one at a time (docs/CANONICAL.md, "Memory"):
    each element still gets the tree over the 4 devices, bit for bit, with the all-to-all's default
    exchange and with ddp-ring's ppermutes. A psum (another association) is caught."""
    import jax
    from jax import lax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from jaxdp.canonical import reduce

    mesh = Mesh(np.array(jax.devices()[:4]), ("d",))
    values = {"w": _four_devices_values((512, 1024)), "b": _four_devices_values((3, 5))}  # w: 2 MiB
    w_bytes = values["w"][0].nbytes
    assert w_bytes >= reduce.ALONE_BYTES and w_bytes >= reduce.PIECES * reduce.MIN_PIECE_BYTES
    want = canonical.tree(jax.tree.map(jnp.asarray, values))
    ring = lambda chunks: canonical.ppermute_exchange(chunks, "d")  # noqa: E731
    for sync in (lambda t: canonical.all_reduce_tree(t, "d"),
                 lambda t: canonical.all_reduce_tree(t, "d", exchange=ring),
                 lambda t: jax.tree.map(lambda a: lax.psum(a, "d"), t)):
        body = jax.shard_map(lambda t, sync=sync: sync(jax.tree.map(lambda a: a[0], t)), mesh=mesh,
                             in_specs=P("d"), out_specs=P(), check_vma=False)
        program = jax.jit(body).lower(values).compile()
        got = program(values)
        equal = all(np.array_equal(np.asarray(got[k]), np.asarray(want[k])) for k in values)
        if "all-reduce" in program.as_text():  # the broken one
            assert not equal
        else:
            assert equal
    hlo = jax.jit(jax.shard_map(lambda t: canonical.all_reduce_tree(jax.tree.map(lambda a: a[0], t), "d"), mesh=mesh,
                                in_specs=P("d"), out_specs=P(), check_vma=False)).lower(values).compile().as_text()
    assert hlo.count("all-to-all(") == reduce.PIECES + 1 and hlo.count("all-gather(") == 2  # w's 4 pieces; b packed
