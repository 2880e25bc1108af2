"""A weight gradient computed in its own layout: `fold_dot_transposes(f)` is `f` with every
`transpose(dot_general(a, b))` that only swaps the product's two free-dimension groups computed as
`dot_general(b, a)` instead, which gives the transposed result directly.

Why: JAX's transpose rule for a matmul's right operand (the weight of `x @ W`) computes `dy^T x`
and then transposes it to W's shape. XLA's algebraic simplifier folds that transpose into the product;
`reduction="canonical"` compiled with the simplifier off until 2026-12-06 (and still does where
`canonical.compiler` says so, docs/CANONICAL.md), so the transpose stayed a strided copy of every
weight gradient, read again by whatever consumes it (measured on the bench's
mlp at N = 4: the all-reduce's slices of the transposed 1024 x 1024 gradient were the step's
costliest operations). Applied to canonical's per-shard backward only: the same program on every
device and every N, so the bits stay the same across N (they may differ from the unfolded program's
in the last place: the product's terms are the same, their order is the kernel's).

The rewrite is evaluated on the traced jaxpr, recursing into `jit` and `checkpoint` bodies (inlined);
every other equation is bound as it was.
"""
from __future__ import annotations

import jax
from jax import lax
from jax.extend import core
from jax.sharding import NamedSharding, PartitionSpec

INLINED = ("pjit", "jit", "closed_call", "core_call", "remat2", "checkpoint")
REMAT = ("remat2", "checkpoint")


def fold_dot_transposes(f):
    """`f`, its transposed matmul products computed directly (see the module)."""
    def folded(*args):
        closed, shape = jax.make_jaxpr(f, return_shape=True)(*args)
        out = _eval(closed.jaxpr, closed.consts, jax.tree.leaves(args))
        return jax.tree.unflatten(jax.tree.structure(shape), out)
    return folded


def _swapped(dot, transpose) -> tuple | None:
    """The dimension numbers of dot_general(rhs, lhs) equal to `transpose(dot_general(lhs, rhs))`, or None
    when the transpose is not that (batch dimensions, another permutation, or an output sharding that is
    not a NamedSharding: under shard_map it is one, of the manual mesh, permuted with the result)."""
    (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
    sharding = dot.params.get("out_sharding")
    if lb or rb or not (sharding is None or isinstance(sharding, NamedSharding)):
        return None
    lhs, rhs = (v.aval.ndim for v in dot.invars)
    n_left = lhs - len(lc)
    n_right = rhs - len(rc)
    want = tuple(range(n_left, n_left + n_right)) + tuple(range(n_left))
    return ((rc, lc), ((), ())) if tuple(transpose.params["permutation"]) == want else None


def _merged(a, b, dims) -> tuple:
    """(a, b, dims) with the contracted dimensions merged into one when both operands contract the same
    count of leading dimensions (a [B, T, m] and b [B, T, n], contracted over B, T: a weight's gradient
    over a sequence's tokens): a reshape of a row-major array, free, and a 2-D product, which XLA:CPU
    runs on the operands as they lie. Left 3-D, the compiler's dot canonicalization transposes the
    operand whose contracted dimensions lead (a strided copy, fused into its producer: on GPT, backward's
    recomputed GELU, then written element by element; measured in docs/CANONICAL.md)."""
    (ac, bc), batch = dims
    lead = tuple(range(len(ac)))
    if len(ac) < 2 or tuple(ac) != lead or tuple(bc) != lead or a.shape[:len(ac)] != b.shape[:len(bc)]:
        return a, b, dims
    rows = 1
    for d in a.shape[:len(ac)]:
        rows *= d
    a = a.reshape(rows, *a.shape[len(ac):])
    b = b.reshape(rows, *b.shape[len(bc):])
    return a, b, (((0,), (0,)), batch)


def _permuted(sharding, permutation) -> NamedSharding:
    """`sharding` (of the unswapped product) for its transpose by `permutation`."""
    spec = tuple(sharding.spec) + (None,) * (len(permutation) - len(sharding.spec))
    return NamedSharding(sharding.mesh, PartitionSpec(*(spec[i] for i in permutation)))


def _foldable(jaxpr) -> dict:
    """{transpose eqn index: its dot eqn}: transposes of a dot result used by nothing else."""
    uses: dict = {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if isinstance(v, core.Var):
                uses[v] = uses.get(v, 0) + 1
    for v in jaxpr.outvars:
        if isinstance(v, core.Var):
            uses[v] = uses.get(v, 0) + 1
    made = {eqn.outvars[0]: eqn for eqn in jaxpr.eqns if eqn.primitive is lax.dot_general_p}
    folds = {}
    for i, eqn in enumerate(jaxpr.eqns):
        src = eqn.invars[0] if eqn.primitive is lax.transpose_p else None
        if isinstance(src, core.Var) and src in made and uses[src] == 1 and _swapped(made[src], eqn):
            folds[i] = made[src]
    return folds


def _remat_fenced(eqn, args: list) -> list:
    """`args` as a checkpoint's lowering hands them to its body: those it keeps from CSE (a differentiated
    checkpoint, `prevent_cse`) behind one optimization barrier. Inlined without it, XLA merged backward's
    recomputation with the forward, and the ported GPT-2's gradients on 1 device differed from those
    on 2, 4 and 8 in the last place (all 28 arrays)."""
    cse = eqn.params.get("prevent_cse", False)
    if eqn.primitive.name not in REMAT or not eqn.params.get("differentiated", False):
        return args
    cse = (cse,) * len(args) if isinstance(cse, bool) else tuple(cse)
    kept = [i for i, c in enumerate(cse) if c]
    if not kept:
        return args
    fenced = lax.optimization_barrier([args[i] for i in kept])
    out = list(args)
    for i, a in zip(kept, fenced, strict=True):
        out[i] = a
    return out


def _eval(jaxpr, consts, args) -> list:
    env = dict(zip(jaxpr.constvars, consts, strict=True)) | dict(zip(jaxpr.invars, args, strict=True))

    def read(v):
        return v.val if isinstance(v, core.Literal) else env[v]

    folds = _foldable(jaxpr)
    skipped = {id(dot) for dot in folds.values()}
    for i, eqn in enumerate(jaxpr.eqns):
        if id(eqn) in skipped:
            continue
        if i in folds:
            dot = folds[i]
            lhs, rhs = (read(v) for v in dot.invars)
            params = dict(dot.params, dimension_numbers=_swapped(dot, eqn))
            if isinstance(params.get("precision"), tuple):
                params["precision"] = params["precision"][::-1]
            if params.get("out_sharding") is not None:
                params["out_sharding"] = _permuted(params["out_sharding"], eqn.params["permutation"])
            a, b, params["dimension_numbers"] = _merged(rhs, lhs, params["dimension_numbers"])
            outs = [lax.dot_general_p.bind(a, b, **params)]
        elif eqn.primitive.name in INLINED and "jaxpr" in eqn.params:
            sub = eqn.params["jaxpr"]
            inner, sub_consts = (sub.jaxpr, sub.consts) if isinstance(sub, core.ClosedJaxpr) else (sub, ())
            outs = _eval(inner, sub_consts, _remat_fenced(eqn, [read(v) for v in eqn.invars]))
        else:
            bound = eqn.primitive.get_bind_params(eqn.params)  # JAX 0.10, 0.11: params (older: subfuns too)
            subfuns, params = bound if isinstance(bound, tuple) else ((), bound)
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*subfuns, *(read(v) for v in eqn.invars), **params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        for v, val in zip(eqn.outvars, outs, strict=True):
            env[v] = val
    return [read(v) for v in jaxpr.outvars]
