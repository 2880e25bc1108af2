"""`fold_dot_transposes` (jaxdp/models/dot_fold.py): a weight gradient's `transpose(dot(dy, x))` computed as
`dot(x, dy)`, in the jaxpr and in the program XLA compiles with the algebraic simplifier off (as canonical
compiles), and nothing else rewritten."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxdp.models import unit_vjp
from jaxdp.models.dot_fold import fold_dot_transposes

NO_ALGSIMP = {"xla_disable_hlo_passes": "algsimp"}


def _layer_vjp(w, x, dy):
    """A dense layer's backward as unit_vjp runs it: jax.vjp of the remat'd unit, applied to dy."""
    apply = jax.checkpoint(lambda p, h: jnp.tanh(h @ p), policy=unit_vjp.SAVE)
    return jax.vjp(apply, w, x)[1](dy)


def _args(rows=6, n_in=24, n_out=40):
    keys = jax.random.split(jax.random.key(0), 3)
    return (jax.random.normal(keys[0], (n_in, n_out)), jax.random.normal(keys[1], (rows, n_in)),
            jax.random.normal(keys[2], (rows, n_out)))


def _primitives(jaxpr) -> list[str]:
    names = []
    for eqn in jaxpr.eqns:
        names.append(eqn.primitive.name)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            names += _primitives(sub)
    return names


def test_the_weight_gradient_is_one_product_in_the_weights_layout():
    w, x, dy = _args()
    plain = jax.make_jaxpr(_layer_vjp)(w, x, dy).jaxpr
    folded = jax.make_jaxpr(fold_dot_transposes(_layer_vjp))(w, x, dy).jaxpr
    assert "transpose" in _primitives(plain) and "transpose" not in _primitives(folded)
    assert _primitives(folded).count("dot_general") == _primitives(plain).count("dot_general")
    want, got = jax.jit(_layer_vjp)(w, x, dy), jax.jit(fold_dot_transposes(_layer_vjp))(w, x, dy)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        assert a.shape == b.shape and np.allclose(a, b, rtol=1e-6, atol=1e-6)


def test_the_compiled_program_without_the_simplifier_has_no_transpose():
    """What canonical compiles (the simplifier off): the unfolded backward keeps a transpose of the
    [24, 40] weight gradient; the folded one has none."""
    def transposes(f):
        hlo = jax.jit(f).lower(*_args()).compile(compiler_options=NO_ALGSIMP).as_text()
        return sum(" transpose(" in line and "[24,40]" in line for line in hlo.splitlines())
    assert transposes(_layer_vjp) >= 1 and transposes(fold_dot_transposes(_layer_vjp)) == 0


def test_other_transposes_and_shared_products_are_left_alone():
    """A transpose that is not the swap of the product's free dimensions (a batched product), and a
    product read by something besides its transpose, stay as they were; the values are the function's."""
    a, b = jax.random.normal(jax.random.key(1), (3, 4, 5)), jax.random.normal(jax.random.key(2), (3, 5, 6))

    def batched(a, b):
        return jnp.transpose(lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,)))), (0, 2, 1))

    def shared(a, b):
        d = a[0] @ b[0]
        return d.T, d.sum()

    for f in (batched, shared):
        got = jax.make_jaxpr(fold_dot_transposes(f))(a, b).jaxpr
        assert _primitives(got) == _primitives(jax.make_jaxpr(f)(a, b).jaxpr)
        for u, v in zip(jax.tree.leaves(f(a, b)), jax.tree.leaves(fold_dot_transposes(f)(a, b)), strict=True):
            assert np.array_equal(u, v)


def test_under_shard_map_the_product_keeps_its_sharding_and_is_folded():
    """Under `shard_map` JAX gives each product an `out_sharding` of the manual mesh: the folded product gets
    it permuted, and the compiled per-device program has no transpose of the weight gradient either (a
    fold that skipped sharded products left every canonical step with N > 1 unfolded, unseen)."""
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:2]), ("d",))

    def transposes(f):
        body = jax.shard_map(f, mesh=mesh, in_specs=(P(), P("d"), P("d")), out_specs=(P(), P("d")), check_vma=False)
        hlo = jax.jit(body).lower(*_args(rows=12)).compile(compiler_options=NO_ALGSIMP).as_text()
        return sum(" transpose(" in line and "[24,40]" in line for line in hlo.splitlines())
    assert transposes(_layer_vjp) >= 1 and transposes(fold_dot_transposes(_layer_vjp)) == 0


def test_a_checkpoints_recomputation_keeps_its_barrier():
    """A checkpoint's body is inlined with the optimization barrier its own lowering puts before it
    (`prevent_cse` of a differentiated checkpoint): the folded backward lowers with as many barriers as
    the plain one. Inlined without it, XLA merged backward's recomputation with the forward and the
    ported GPT-2's canonical gradients on 1 device differed from those on 2, 4 and 8 in the last place."""
    def barriers(f):
        return jax.jit(f).lower(*_args()).as_text().count("optimization_barrier")
    assert barriers(_layer_vjp) >= 1 and barriers(fold_dot_transposes(_layer_vjp)) == barriers(_layer_vjp)


def test_a_weight_gradient_over_tokens_is_a_2d_product_with_no_transposed_copy(monkeypatch):
    """x [B, T, m] @ W: the weight's gradient contracts B and T. Folded, the two are merged into one (a
    reshape) and the compiled product reads the activations as they lie; left 3-D, XLA's dot
    canonicalization transposes the recomputed activation into a [m, B, T] copy (on GPT: backward's
    GELU, written element by element; docs/CANONICAL.md). The values are the plain backward's."""
    from jaxdp.models import dot_fold

    w, _, _ = _args()
    keys = jax.random.split(jax.random.key(1), 2)
    x, dy = jax.random.normal(keys[0], (2, 6, 24)), jax.random.normal(keys[1], (2, 6, 40))

    def transposed(f):
        hlo = jax.jit(f).lower(w, x, dy).compile(compiler_options=NO_ALGSIMP).as_text()
        return sum(" transpose(" in line and ("[24,2,6]" in line or "[24,12]" in line) for line in hlo.splitlines())
    assert transposed(fold_dot_transposes(_layer_vjp)) == 0
    want, got = jax.jit(_layer_vjp)(w, x, dy), jax.jit(fold_dot_transposes(_layer_vjp))(w, x, dy)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        assert a.shape == b.shape and np.allclose(a, b, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(dot_fold, "_merged", lambda a, b, dims: (a, b, dims))
    assert transposed(fold_dot_transposes(_layer_vjp)) >= 1
