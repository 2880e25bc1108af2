"""Non-trainable state through a step, for every strategy: BatchNorm's running statistics.

A model with `nnx.BatchStat` variables gives its `Problem` a `state` (their values, a pure dict) and
`update_state(params, state, x)` (one training-mode forward on the rows `x`, returning the updated
statistics). The running statistics do not enter the loss (training-mode BatchNorm normalises with
the batch's statistics), so the strategies' gradient steps stay as they are, and the statistics are
advanced by a second, forward-only program per step (`make`): on each device, one forward per
micro-batch, in order, on the same rows and the same parameters (before the update) as the
gradient step, with the same statistics (`sync`: over the `data` axis). That costs one extra forward
per micro-batch (zero3: one more all-gather of the parameters); the strategies' compiled steps are
unchanged.

Afterwards every device takes device 0's statistics: torch DDP's `broadcast_buffers=True` (rank 0's
buffers are broadcast before each forward, so rank 0's running statistics are the run's). Under
`sync` BatchNorm they are the same on every device anyway; under `local` they are rank 0's.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from .. import canonical, devices
from ..core.registry import strategies as registry
from ..devices import AXIS, replicated
from .common import to_numpy
from .zero import layout as zero_layout
from .zero.flat import unpad


def plain_advance(problem, params, state, x, accum: int):
    """`state` after one forward on each of this device's `accum` micro-batches, in order."""
    xs = x.reshape(accum, x.shape[0] // accum, *x.shape[1:])
    state, _ = lax.scan(lambda s, xb: (problem.update_state(params, s, xb), None), state, xs)
    return state


def from_root(a):
    """Device 0's value of `a` on every device (a psum of it and zeros: exact)."""
    return lax.psum(jnp.where(lax.axis_index(AXIS) == 0, a, jnp.zeros_like(a)), AXIS)


def make(name: str, problem, mesh, accum: int, opts=None):
    """`(params as the train state holds them, state, x placed as put_sharded places it) -> state`,
    jitted; None for a problem without state. ddp-pmap's stacked parameters are passed unstacked
    (`strategy.full_params`). `opts.reduction == "canonical"`: the canonical statistics of each
    micro-batch (`canonical.batchnorm.running_statistics`), the same on every device."""
    if problem.update_state is None:
        return None
    is_canonical = opts is not None and opts.reduction == "canonical"
    if is_canonical:
        if registry.on_one_device(name):  # ddp's program on its one device, as the step (strategies/single.py)
            mesh = devices.mesh(mesh.devices.flat[:1])
        advance = canonical_advance(opts, mesh.size)
        compiler_options = canonical.compiler.compiler_options(problem.params)  # no update: the simplifier on
    else:
        advance, compiler_options = plain_advance, None
    if registry.on_one_device(name) and not is_canonical:  # canonical's single is ddp's program on one device
        return jax.jit(lambda params, state, x: advance(problem, params, state, x, accum),
                       compiler_options=compiler_options)
    shapes = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), problem.params)
    layout = zero_layout.of(name)  # sharded parameters (zero3): flat shards, gathered for the forward

    def device(params, state, x):
        if layout.shards_params:
            params = jax.tree.map(lambda s, like: unpad(lax.all_gather(s, AXIS, tiled=True), like), params, shapes)
        state = advance(problem, params, state, x, accum)
        return state if is_canonical else jax.tree.map(from_root, state)  # canonical: equal everywhere

    return jax.jit(jax.shard_map(device, mesh=mesh, in_specs=(layout.param_spec, P(), P(AXIS)), out_specs=P(),
                                 check_vma=False), compiler_options=compiler_options)


def canonical_advance(opts, n: int):
    """`advance` under reduction="canonical": S shards per micro-batch, their statistics by the tree."""
    def advance(problem, params, state, x, accum):
        shards = canonical.step.step_shards(x, opts.shards, accum, n)
        return canonical.batchnorm.running_statistics(problem, params, state, x, accum, shards // n)
    return advance


def place(name: str, state, mesh):
    """The initial state on the devices: on the one device (`single`), else replicated."""
    state = to_numpy(state)
    if registry.on_one_device(name):
        return jax.device_put(state, mesh.devices.flat[0])
    return jax.device_put(state, replicated(mesh))
