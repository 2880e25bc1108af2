"""A model run unit by unit, FSDP-style, each unit one `jax.custom_vjp` whose parameters come from a
function (`gather`) and whose gradient goes to one (`reduce_scatter`), written so that the *compiled*
program keeps the schedule: zero3's units (`strategies/zero/fsdp.py`), and canonical's per-shard
program for every strategy (`canonical/step.py`: nothing gathered, nothing reduced).

Each unit of the model (`models.units`: an MLP layer; a transformer block; the embeddings; the head)
runs as one `jax.custom_vjp`:
- forward: all-gather the unit's parameter shards, run the unit, and free the full parameters (they
  are not among the residuals kept for backward: only the unit's input and its matmul outputs are);
- backward: all-gather the shards again, run the unit's backward, and reduce-scatter its parameter
  gradient at once (or, under accumulation, hand the full local gradient out unreduced: no_sync).
With `reshard_after_forward=False` the full parameters are kept as residuals instead: no re-gather.
A parameter listed by several units (a tied weight: GPT-2's `wte`, embedding and head) belongs to the
root, as in torch FSDP2 when it is left to the root module: gathered once per micro-batch before the
first unit, handed to each unit that uses it with the unit's input (so autodiff sums its uses'
gradients), never re-gathered, and its summed gradient reduce-scattered once after the last backward.

Why this shape (docs/STRATEGIES.md has the measurements): XLA:CPU removes optimization barriers
(`cse_barrier_expander`) and then merges identical computations (CSE), and its scheduler is free to
run an all-gather as early as its operands exist. So every gather is made to depend, by value, on
the data that must exist before it: the forward gather on the unit's input, the backward gather on
the incoming cotangent and on that input, and the next unit's backward on this unit's reduce-scatter
(`tie`). A dependency by value survives every pass; the re-gather cannot be merged with the forward
gather (its operand differs) nor hoisted above the forward (it needs the cotangent), nor out of the
accumulation loop (it needs the micro-batch: the unit that gives the loss gets the same cotangent,
1/A, in every micro-batch; measured: a plain loss_fn's re-gather ran once for all micro-batches).

The ties also forbid prefetching (gathering unit i+1 while unit i computes), which is what hides
FSDP's communication on a GPU; tying each gather to the previous unit's input instead would allow it
with at most two units gathered. Not done: on XLA:CPU collectives do not overlap compute anyway.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from . import units as unit_lib
from .dot_fold import fold_dot_transposes

SAVE = jax.checkpoint_policies.dots_saveable  # residuals: matmul outputs (+ inputs); the rest recomputed


def tie(tree, dep):
    """`tree`, unchanged in value, made to depend on every leaf of `dep` (an edge the compiler keeps):
    each leaf plus 0 x (the sum of dep's leaves' first elements). Exact for finite `dep` (a non-finite
    one makes the loss non-finite anyway, which the run reports). XLA's algebraic simplifier folds
    x * 0 only for integers (NaN * 0 is NaN), so the edge survives optimisation; an optimization
    barrier does not, on XLA:CPU (`cse_barrier_expander` removes it). An empty `dep` (a unit that owns no
    parameters of its own, only shared ones: its gather and reduce-scatter are of nothing) adds no edge."""
    leaves = jax.tree.leaves(dep)
    if not leaves:
        return tree
    first = sum(jnp.ravel(d)[0].astype(jnp.float32) for d in leaves)
    return jax.tree.map(lambda a: a + first.astype(a.dtype) * 0, tree)


UINT = {2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def bits_tie(tree, dep):
    """`tie` in the integers, for canonical's program (fold=True): each float leaf's bits plus 0 x (the bits
    of dep's first elements), so the leaf's bits come out unchanged whatever dep holds (NaN included).
    The simplifier folds an integer x 0: the edge survives only where canonical compiles without it
    (`canonical.compiler`); elsewhere canonical's zero3 has XLA's order of gathers.
    Measured: with `tie`'s float + 0.0 and the folded products, GPT's zero3 bias gradients differed from
    `single`'s in the last bit (docs/CANONICAL.md, "What had to be fixed in the compiler")."""
    leaves = jax.tree.leaves(dep)
    if not leaves:
        return tree
    first = sum(jnp.ravel(d)[0].astype(jnp.float32) for d in leaves)
    zero = jax.lax.bitcast_convert_type(first, jnp.uint32) * jnp.uint32(0)

    def one(a):
        if not jnp.issubdtype(a.dtype, jnp.floating):
            return a
        u = UINT[a.dtype.itemsize]
        return jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(a, u) + zero.astype(u), a.dtype)
    return jax.tree.map(one, tree)


def regather_after(dy, mark):
    """What a unit's backward re-gather waits for: the cotangent `dy`, and `mark`, a scalar of each of
    the unit's inputs (per micro-batch: the unit giving the loss gets the same dy, 1/A, in every one)."""
    return dy, mark


class _Slot:
    """A placeholder for the i-th full parameter among a unit's saved residuals."""

    def __init__(self, i):
        self.i = i


jax.tree_util.register_pytree_node(_Slot, lambda s: ((), s.i), lambda i, _: _Slot(i))


def without_params(vjp_fn, full):
    """`vjp_fn` with every residual that *is* one of the gathered parameters replaced by a `_Slot`:
    what forward keeps for backward, without the full parameters."""
    index = {id(p): i for i, p in enumerate(jax.tree.leaves(full))}
    leaves, treedef = jax.tree.flatten(vjp_fn)
    return treedef.unflatten([_Slot(index[id(r)]) if id(r) in index else r for r in leaves])


def with_params(saved, full):
    """The inverse of `without_params`, with the (re-gathered) parameters `full` in the slots."""
    params = jax.tree.leaves(full)
    leaves, treedef = jax.tree.flatten(saved, is_leaf=lambda r: isinstance(r, _Slot))
    return treedef.unflatten([params[r.i] if isinstance(r, _Slot) else r for r in leaves])


def fsdp_unit(apply, gather, reduce_scatter, *, reshard_after_forward: bool, sync: bool, ties: bool = True,
              fold: bool = False):
    """`run(shards, sink, x) -> y`: the unit `apply(full params, x)` on gathered parameters.

    sync=True: the gradient of `shards` is the unit's reduce-scattered gradient (sink is None).
    sync=False (no_sync, for accumulation): the gradient goes out unreduced as the gradient of
    `sink`, a zero tree shaped like the full parameters; `shards` gets a zero gradient.
    ties=False (nothing to gather: `gather` is the identity): no `tie`, which would copy every parameter.
    fold=True: backward's transposed weight-gradient products computed in the weight's layout
    (`dot_fold`: canonical's per-shard program, compiled without the simplifier that would do it),
    and the ties made in the integers (`bits_tie`).
    """
    tied = (bits_tie if fold else tie) if ties else (lambda tree, dep: tree)
    remat_apply = jax.checkpoint(apply, policy=SAVE)

    @jax.custom_vjp
    def run(shards, sink, x):
        return apply(gather(shards), x)

    def fwd(shards, sink, x):
        full = gather(tied(shards, x))  # not before the unit's input exists
        y, vjp_fn = jax.vjp(remat_apply, full, x)
        if not reshard_after_forward:
            return y, (shards, None, vjp_fn)
        mark = jax.tree.map(lambda a: jnp.ravel(a)[0], x)  # a scalar per input leaf: this micro-batch's
        return y, (shards, mark, without_params(vjp_fn, full))

    def bwd(res, dy):
        shards, mark, saved = res
        if reshard_after_forward:
            full = gather(tied(shards, regather_after(dy, mark)))  # gathered again, in this micro-batch's backward
            dy = tied(dy, full)  # uses every gathered leaf: the whole unit, as FSDP gathers it
            vjp_fn = with_params(saved, full)
        else:
            vjp_fn = saved
        dfull, dx = (fold_dot_transposes(vjp_fn) if fold else vjp_fn)(dy)
        if not sync:
            return jax.tree.map(jnp.zeros_like, shards), dfull, dx
        dshards = reduce_scatter(dfull)
        # the unit's reduce-scatter runs before the next unit's backward (integer inputs: no cotangent)
        dx = jax.tree.map(lambda d: tie(d, dshards) if jnp.issubdtype(d.dtype, jnp.inexact) else d, dx)
        return dshards, None, dx

    run.defvjp(fwd, bwd)
    return run


def root_gather(gather, reduce_scatter, *, sync: bool, ties: bool = True):
    """`run(shards, sink, x) -> full`: the root's shared parameters, as FSDP2 treats a tied weight
    left to the root module: gathered once (per micro-batch) before the first unit, kept for every
    use through backward (never re-gathered), and the sum of all uses' gradients reduce-scattered
    once, after the last unit's backward (sync=False: handed out unreduced as `sink`'s gradient)."""

    @jax.custom_vjp
    def run(shards, sink, x):
        return gather(shards)

    def fwd(shards, sink, x):
        return gather(tie(shards, x) if ties else shards), shards

    def bwd(shards, dfull):
        if not sync:
            return jax.tree.map(jnp.zeros_like, shards), dfull, None
        return reduce_scatter(dfull), None, None

    run.defvjp(fwd, bwd)
    return run


def without_shared(unit, shared) -> tuple[unit_lib.Unit, bool]:
    """`unit` owning only its own paths; if it also uses shared ones, it takes `(x, shared full params)`
    as input and puts them back in place (True: it uses them)."""
    own = tuple(p for p in unit.paths if p not in shared)
    if len(own) == len(unit.paths):
        return unit, False

    def apply(params, x_root):
        x, root = x_root
        by_path = {**dict(zip(own, params, strict=True)), **dict(zip(shared, root, strict=True))}
        return unit.apply(tuple(by_path[p] for p in unit.paths), x)

    return unit_lib.Unit(unit.name, own, apply), True


def unit_loss(problem, shapes, gather_leaf, scatter_leaf, reshard_after_forward: bool, sync: bool,
              ties: bool = True, fold: bool = False):
    """`(loss(parts, sinks, x, y), groups, group_shapes)`: the model's loss run unit by unit on the
    param shards split by group (`parts`); see `strategies/zero/fsdp.unit_grads`."""
    if not problem.units:
        raise ValueError("zero3 runs a model unit by unit: give the model `unit_specs()` (jaxdp/models/units.py)")
    shared = unit_lib.shared_paths(problem.units)
    units, uses_root = zip(*(without_shared(unit, shared) for unit in problem.units), strict=True)
    groups = ((unit_lib.Unit("root", shared, None),) if shared else ()) + units  # disjoint paths
    group_shapes = unit_lib.split(shapes, groups)

    def scatter(grads):
        return jax.tree.map(scatter_leaf, grads)

    def gatherer(shape):
        return lambda shards: jax.tree.map(gather_leaf, shards, shape)

    own_shapes = group_shapes[len(groups) - len(units):]
    runs = [fsdp_unit(unit.apply, gatherer(shape), scatter, reshard_after_forward=reshard_after_forward,
                      sync=sync, ties=ties, fold=fold) for unit, shape in zip(units, own_shapes, strict=True)]
    if shared:
        runs.insert(0, root_gather(gatherer(group_shapes[0]), scatter, sync=sync, ties=ties))

    def loss(parts, sinks, x, y):
        h = x if problem.head is not None else (x, y)  # head None: the units take (x, y), give the loss
        root = runs[0](parts[0], sinks[0], x) if shared else None
        k = len(groups) - len(units)
        for run, shards, sink, uses in zip(runs[k:], parts[k:], sinks[k:], uses_root, strict=True):
            h = run(shards, sink, (h, root) if uses else h)
        return h if problem.head is None else problem.head(h, y)

    return loss, groups, group_shapes


def unit_value_and_grad(problem, shapes, gather_leaf, reshard_after_forward: bool, ties: bool = True,
                        fold: bool = False):
    """`(param shards, x, y) -> (loss, full local gradient)` unit by unit, gathering each unit forward
    and backward and reducing nothing (no_sync): the per-shard program of `reduction="canonical"`
    (ties=False: `gather_leaf` is the identity, the parameters are not copied)."""
    loss, groups, group_shapes = unit_loss(problem, shapes, gather_leaf, None, reshard_after_forward, sync=False,
                                           ties=ties, fold=fold)

    def value_and_grad(param_shards, x, y):
        parts = unit_lib.split(param_shards, groups)
        sinks = [jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shape) for shape in group_shapes]
        value, full = jax.value_and_grad(lambda sinks: loss(parts, sinks, x, y))(sinks)
        return value, unit_lib.join(full, groups)

    return value_and_grad
