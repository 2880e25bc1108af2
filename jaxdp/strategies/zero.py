"""`zero1`, `zero2`, `zero3` (alias `fsdp`): ZeRO's three stages, sharding what DDP replicates.

Layout: every parameter is flattened and zero-padded to a multiple of N; device i owns the i-th
contiguous shard of S = ceil(size / N) elements of each parameter. The padding is zero in the
parameters and in the gradients, so it stays zero through any element-wise optimizer and adds
nothing to norms; it is cut off whenever a full array is rebuilt.

- zero1: optimizer state sharded. Gradients all-reduced (every device gets the whole mean
  gradient); each device updates only its shard with its shard of the state; the updated shards
  are all-gathered into full parameters.
- zero2: gradients sharded too: reduce-scattered, so each device only ever keeps its shard of the
  mean gradient; then as zero1.
- zero3: parameters sharded too; FSDP by units (`fsdp.py`): each unit of the model (an MLP layer,
  a transformer block, the embeddings, the head) is all-gathered just before its forward and freed
  after it, gathered again just before its backward (not with reshard_after_forward=False), and its
  gradient reduce-scattered as backward produces it; no device ever holds full parameters between
  steps, nor (accum 1) more than two units' full parameters and gradients during one. Asserted on
  the compiled program.

Accumulation syncs once: the micro-batches' local gradients are summed on each device, then reduced
(zero3: FSDP's no_sync, gathers for every micro-batch and the full local gradients reduce-scattered
once after the loop). Gradients are divided by N before the reduction, as in `ddp`.

`--collectives xla` uses lax.psum / psum_scatter / all_gather; `--collectives ring` uses the
explicit ring from `jaxdp.collectives`; both give the same trace. All run under
shard_map(check_vma=False): gradients of replicated inputs are then local, with no implicit psum.

The optimizer runs outside the shard_map, in the same jit, on the global flat arrays ([N x S],
sharded over `data`): any optax transformation then has global semantics, and XLA inserts the
reductions it needs (a `clip_by_global_norm` in a user's chain takes the norm of the whole gradient,
not the shard's; the zero padding adds nothing to it). A transformation whose update depends on
the parameters' shapes (matrix orthogonalisation, masks by rank) cannot run on this layout:
`check_elementwise` probes for it and names it.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .. import canonical
from .. import collectives as ring
from ..devices import AXIS, replicated
from . import fsdp
from .common import (
    Strategy,
    TrainState,
    apply_update,
    compile_options,
    local_grads,
    put_sharded,
    shard_values_of,
    to_host,
    to_numpy,
)


def shard_size(size: int, n: int) -> int:
    return -(-size // n)


class Collectives:
    """The three collectives ZeRO needs, over the `data` axis, on flat 1-D arrays."""

    def __init__(self, kind: str):
        self.kind = kind

    def all_reduce(self, x):
        return ring.ring_all_reduce(x, AXIS) if self.kind == "ring" else lax.psum(x, AXIS)

    def reduce_scatter(self, x):
        """Pad to N x S, sum over devices, keep this device's S elements."""
        if self.kind == "ring":
            return ring.ring_reduce_scatter(x, AXIS)
        return lax.psum_scatter(ring.pad_to_multiple(x, lax.axis_size(AXIS)), AXIS, tiled=True)

    def all_gather(self, shard):
        return ring.ring_all_gather(shard, AXIS) if self.kind == "ring" else lax.all_gather(shard, AXIS, tiled=True)


def my_shard(full, n, multiple=None):
    """This device's shard of a full (replicated) array: elements [i S, (i+1) S) of the flat padded to a
    multiple of `multiple` (default n)."""
    flat = ring.pad_to_multiple(full, multiple or n)
    s = flat.size // n
    return lax.dynamic_slice(flat, (lax.axis_index(AXIS) * s,), (s,))


def unpad(flat, like):
    """The first prod(shape) elements of a padded flat array, reshaped like `like`."""
    return flat[:math.prod(like.shape)].reshape(like.shape)


def host_shards(tree, multiple):
    """Full host arrays -> the flat arrays padded to a multiple of `multiple` (N; canonical: BLOCKS), whose
    device-order shards we place (scalars, such as Adam's step count, stay as they are: replicated)."""
    return jax.tree.map(lambda p: np.pad(p.reshape(-1), (0, -p.size % multiple)) if p.ndim else p,
                                  to_numpy(tree))


def host_unshard(flat_tree, shapes):
    """Global [N x S] sharded arrays -> full unpadded host arrays."""
    return jax.tree.map(lambda f, shape: unpad(to_host(f), shape), flat_tree, shapes)


def stage_grads(stage: int, problem, comm: Collectives, shapes, n: int, opts):
    """`(params, x, y) -> (mean loss, this device's gradient shards, the gradient for the trace)`,
    communicating once per step (zero3: its units' gathers every micro-batch, `fsdp.unit_grads`)."""
    tree_map = jax.tree.map
    if stage == 3:
        unit_grads = fsdp.unit_grads(problem, shapes, lambda s, shape: unpad(comm.all_gather(s), shape),
                                     lambda g: comm.reduce_scatter(g.reshape(-1) / n), opts.accum,
                                     opts.reshard_after_forward)

        def zero3_grads(param_shards, x, y):
            loss, shards = unit_grads(param_shards, x, y)
            return loss, shards, shards
        return zero3_grads

    def zero12_grads(params, x, y):
        loss, grads = local_grads(problem.loss_fn, params, x, y, opts.accum)
        grads = tree_map(lambda g: g / n, grads)
        if stage == 1:
            full = tree_map(comm.all_reduce, grads)  # every device: the whole mean gradient
            return loss, tree_map(lambda g: my_shard(g, n), full), full
        shards = tree_map(lambda g: comm.reduce_scatter(g.reshape(-1)), grads)  # only my shard
        return loss, shards, shards
    return zero12_grads


def canonical_stage_grads(stage: int, problem, comm: Collectives, shapes, n: int, opts):
    """`stage_grads` under reduction="canonical": per-shard values (zero3: unit by unit, nothing reduced
    inside), the tree across devices as a canonical reduce-scatter (zero1: all-reduce) on the flat
    layout padded to a multiple of BLOCKS, the global means, then the canonical clip; returns
    (loss, clipped gradient shards, the unclipped gradient for the trace)."""
    tree_map = jax.tree.map
    if stage == 3:
        shard_values = shard_values_of(problem, lambda s, shape: unpad(comm.all_gather(s), shape),
                                       opts.reshard_after_forward)
    else:
        shard_values = shard_values_of(problem)
    ring_kind = comm.kind == "ring"
    exchange = (lambda chunks: canonical.ppermute_exchange(chunks, AXIS)) if ring_kind else None
    gather = (lambda chunk: ring.ring_all_gather(chunk, AXIS)) if ring_kind else None

    def sync(values):
        loss, grads = values
        loss = canonical.combine(loss, AXIS)
        if stage == 1:  # every device: the whole gradient
            return loss, canonical.all_reduce_tree(grads, AXIS, gather, exchange)
        padded = tree_map(lambda g: jnp.pad(g.reshape(-1), (0, -g.size % canonical.BLOCKS)), grads)
        return loss, tree_map(lambda g: canonical.combine_scatter(g, AXIS, exchange), padded)

    def grads_of(params, x, y):
        loss, grads = canonical.step_values(shard_values, params, x, y, opts, n, sync)
        if stage == 1:
            clipped = canonical.clip(grads, opts.clip_norm)
            return loss, tree_map(lambda g: my_shard(g, n, canonical.BLOCKS), clipped), grads
        return loss, canonical.clip(grads, opts.clip_norm, AXIS, sharded=True), grads
    return grads_of


def apply_global_update(optimizer, grad_flat, opt_state, param_flat):
    """The optimizer's step on the global flat arrays (outside the shard_map): XLA partitions it."""
    return apply_update(optimizer, grad_flat, opt_state, param_flat)


def init_sharded(stage: int, optimizer, mesh, multiple: int):
    """`init(params, opt_state=None)`: the optimizer state on the flat layout (padded to `multiple`),
    sharded over `data`; the parameters replicated (zero1/2) or as flat shards (zero3)."""
    sharded = NamedSharding(mesh, P(AXIS))
    opt_init = jax.jit(optimizer.init)

    def init(params, opt_state=None):
        flat = jax.device_put(host_shards(params, multiple), sharded)
        with jax.set_mesh(mesh):  # new arrays (a step count) need the mesh: explicit sharding
            state = opt_init(flat)  # optimizer state on the flat layout, sharded as XLA propagates it
        if opt_state is not None:  # a full (canonical) state: laid out as the fresh one
            state = jax.tree.map(lambda a, like: jax.device_put(a, like.sharding), host_shards(opt_state, multiple),
                                 state)
        if stage < 3:
            return TrainState(jax.device_put(to_numpy(params), replicated(mesh)), state)
        return TrainState(flat, state)
    return init


def make_stage(stage: int):
    def make(problem, optimizer, mesh, opts, return_grads=True) -> Strategy:
        n = mesh.size
        comm = Collectives(opts.collectives)
        tree_map = jax.tree.map
        shapes = tree_map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), problem.params)  # leaves, not tuples
        param_spec = P(AXIS) if stage == 3 else P()
        is_canonical = opts.reduction == "canonical"
        multiple = canonical.BLOCKS if is_canonical else n  # the flat layout's padding
        init = init_sharded(stage, optimizer, mesh, multiple)

        grads_of = (canonical_stage_grads if is_canonical else stage_grads)(stage, problem, comm, shapes, n, opts)

        def device_grads(params, x, y):
            loss, grad_shards, grads_out = grads_of(params, x, y)
            param_shards = tree_map(lambda p: my_shard(p, n, multiple), params) if stage < 3 else params
            if not is_canonical:
                loss = lax.psum(loss, AXIS) / n  # one scalar all-reduce, for the log
            return loss, grad_shards, grads_out, param_shards

        grad_spec = P() if stage == 1 else P(AXIS)
        sharded_grads = jax.shard_map(device_grads, mesh=mesh, in_specs=(param_spec, P(AXIS), P(AXIS)),
                                      out_specs=(P(), P(AXIS), grad_spec, P(AXIS)), check_vma=False)
        # Rebuild full parameters from everyone's updated shard (zero1/2).
        gather = jax.shard_map(lambda flat: tree_map(lambda s, shape: unpad(comm.all_gather(s), shape), flat, shapes),
                               mesh=mesh, in_specs=P(AXIS), out_specs=P(), check_vma=False)

        def train_step(state, x, y):
            loss, grad_flat, grads_out, param_flat = sharded_grads(state.params, x, y)
            param_flat, opt_state = apply_global_update(optimizer, grad_flat, state.opt_state, param_flat)
            params = gather(param_flat) if stage < 3 else param_flat
            metrics = {"loss": loss, "grads": grads_out} if return_grads else {"loss": loss}
            return TrainState(params, opt_state), metrics

        jit_step = jax.jit(train_step, donate_argnums=0, compiler_options=compile_options(opts))

        def step(state, x, y):
            state, metrics = jit_step(state, x, y)
            if return_grads and stage > 1:
                metrics = {**metrics, "grads": host_unshard(metrics["grads"], shapes)}
            return state, metrics

        def full_params(state):
            return state.params if stage < 3 else host_unshard(state.params, shapes)

        return Strategy(f"zero{stage}", init, put_sharded(mesh), step, full_params, jit_step)

    return make
