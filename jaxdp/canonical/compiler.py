"""The compiler options of a canonical program (docs/CANONICAL.md, "The simplifier on").

XLA's algebraic simplifier rewrites `x / broadcast(s)` into `x * broadcast(1 / s)` (another rounding) when
the scalar `s` has that one broadcast as its only user. Identical operations on identical operands are one
value by the time it runs (shardy's import merges them; XLA's CSE pass, which merged more in partitioned
programs than in one device's, is off: COMPILER_OPTIONS), so a scalar broadcast to several leaves of one
shape has one broadcast, and to leaves of several shapes several. An optimizer's per-step scalars (Adam's
bias corrections) reach the parameters that way, and ZeRO's flat layout (one shape per padded length) can
give a scalar one broadcast where the replicated layout gives it several. `compiler_options(params,
optimizer)` reads the optimizer's update in both layouts and keeps the simplifier off (UNSIMPLIFIED) when
some scalar of it has a lone broadcast in either: the choice depends on the model and the optimizer only,
so every strategy and N compile alike.
"""
from __future__ import annotations

import math

import jax
from jax.extend.core import Literal

from ..core.run.reduction import BLOCKS

COMPILER_OPTIONS = {"xla_disable_hlo_passes": "cse"}  # the simplifier on, common-subexpression elimination off
UNSIMPLIFIED = {"xla_disable_hlo_passes": "algsimp"}  # the simplifier off (and CSE on, as XLA's default)


def compiler_options(params, optimizer=None) -> dict:
    """COMPILER_OPTIONS, or UNSIMPLIFIED when `optimizer`'s update on `params` (arrays or shapes) broadcasts
    some scalar through one broadcast alone, on the true shapes or on the flat layout (each parameter
    flattened and zero-padded to a multiple of BLOCKS). No optimizer (a forward-only program): COMPILER_OPTIONS."""
    if optimizer is None:
        return COMPILER_OPTIONS
    full = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
    flat = jax.tree.map(lambda p: jax.ShapeDtypeStruct((-(-math.prod(p.shape) // BLOCKS) * BLOCKS,) if p.shape
                                                       else (), p.dtype), params)
    return UNSIMPLIFIED if lone_broadcast(optimizer, full) or lone_broadcast(optimizer, flat) else COMPILER_OPTIONS


def lone_broadcast(optimizer, shapes) -> bool:
    """Whether a scalar of `optimizer`'s update on `shapes` (its state as `init` makes it) has one broadcast as
    its only user; True for an update that cannot be traced so (it compiles as canonical did before: the
    simplifier off)."""
    try:
        state = jax.eval_shape(optimizer.init, shapes)
        closed = jax.make_jaxpr(optimizer.update)(shapes, state, shapes)
    except Exception:  # noqa: BLE001 - an update needing more than (grads, state, params): read nothing
        return True
    users: dict = {}
    _number(closed.jaxpr, [("in", i) for i in range(len(closed.jaxpr.invars))], users)
    return any(len(u) == 1 and next(iter(u))[0] == "broadcast_in_dim" for u in users.values())


def _number(jaxpr, names, users) -> list:
    """Value numbers of `jaxpr`'s outputs given its inputs' (`names`), nested jaxprs inlined; fills `users`:
    each scalar's value number -> the value numbers of what reads it. An operation of a scalar and an array
    reads it through a broadcast to its output's shape, one per shape (as the lowered program does after
    shardy merged them); an explicit `broadcast_in_dim` of it is one of those."""
    env = dict(zip(jaxpr.invars, names, strict=True))
    env.update((v, ("const", id(v))) for v in jaxpr.constvars)  # each constant its own value

    def read(v):
        return ("lit", repr(v.val)) if isinstance(v, Literal) else env[v]
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        inner = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
        if inner is not None and len(eqn.invars) == len(getattr(inner, "jaxpr", inner).invars):
            outs = _number(getattr(inner, "jaxpr", inner), ins, users)
        else:
            key = (eqn.primitive.name, repr(sorted((k, repr(p)) for k, p in eqn.params.items())), tuple(ins))
            outs = [(eqn.primitive.name, key, i) for i in range(len(eqn.outvars))]
            shape = eqn.outvars[0].aval.shape if eqn.outvars else ()
            for v, name in zip(eqn.invars, ins, strict=True):
                if not isinstance(v, Literal) and v.aval.shape == ():  # read directly, or broadcast to `shape`
                    users.setdefault(name, set()).add(("broadcast_in_dim", shape, name) if shape else outs[0])
        env.update(zip(eqn.outvars, outs, strict=True))
    for v in jaxpr.outvars:
        if not isinstance(v, Literal) and v.aval.shape == () and read(v) in users:
            users[read(v)].add(("out",))
    return [read(v) for v in jaxpr.outvars]
