"""The -jit strategies' shared step: plain `jax.jit` over the train state and batch placed with `NamedSharding`s
(`layout.py`), with no shard_map and no collective written by hand. Each strategy (`ddp.py`, `zero1.py`,
`fsdp.py`) gives its layout and, for `axis_type="explicit"`, its own step body; this module builds the rest.

- `auto` (`AxisType.Auto`): the loss and the optimizer on global arrays, accumulation a scan over the
  micro-batches (`plain_body`, the same for the three): the partitioner (GSPMD / Shardy) decides every
  collective from the shardings of the inputs and outputs. What it decided is read by `jaxdp inspect`.
- `explicit` (`AxisType.Explicit`): shardings are part of the types and the body places the gradient's
  reduction itself (`device_grads` -> `sum_devices`): each device's own gradient sum, carried across the
  micro-batch scan as an array with a device axis sharded over `data` (the unreduced state, written as
  the axis it stands for), reduced once per step. Why not `reduced` parameters, as JAX's "Autodiff and
  sharding" page does: on JAX 0.10 an elementwise op refuses a reduced operand next to a batch-sharded
  one (`lax.default_nary_reduced_rule`: "Inputs cannot be sharded/varying on the same axes that another
  input is reduced on"), so any bias add fails; the device axis needs nothing from the model.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, auto_axes, reshard
from jax.sharding import PartitionSpec as P

from ...core.run.config import ConfigError
from ...devices import AXIS
from .. import finite
from ..common import Strategy, TrainState, apply_update, to_numpy
from . import layout as layout_mod


class MeshStep:
    """The jitted step, called and lowered with its mesh set (`jax.set_mesh`: explicit types need it)."""

    def __init__(self, jitted, mesh):
        self.jitted, self.mesh = jitted, mesh

    def __call__(self, *args):
        with jax.set_mesh(self.mesh):
            return self.jitted(*args)

    def lower(self, *args):
        with jax.set_mesh(self.mesh):
            return self.jitted.lower(*args)


def put_batch(mesh, accum: int):
    """`put_batch`: the micro-major rows (`data.micro_major`) as `(accum, N, rows per device, ...)` placed
    `P(None, 'data')`: micro-batch j is `[j]`, device d holds `[:, d]`, single's rows in single's order."""
    sharding = NamedSharding(mesh, P(None, AXIS))
    local, n = len(mesh.local_devices), mesh.size

    def place(a):
        a = np.asarray(a)
        parts = a.reshape(local, accum, -1, *a.shape[1:]).swapaxes(0, 1)
        return jax.make_array_from_process_local_data(sharding, parts, (accum, n, *parts.shape[2:]))

    return lambda x, y: (place(x), place(y))


def device_mean(loss_fn):
    """`(params, x, y) -> (loss, gradient)` for one micro-batch `(N, rows per device, ...)`: the mean over the
    device axis of each device's own (a `jax.vmap` of the gradient over that axis), each in the parameters'
    dtype: in bf16 runs the cast's transpose makes a device's gradient fp32 before the mean, so the
    partitioner's reduction of it is fp32. The gradient of the global mean loss instead ends in a bf16
    weight product contracted over the sharded rows, and the partitioner reduces that product where it is:
    in bf16, before the cast back (docs/STRATEGIES.md, "Mixed precision under the partitioner")."""
    per_device = jax.vmap(jax.value_and_grad(loss_fn), in_axes=(None, 0, 0))
    return lambda params, x, y: jax.tree.map(lambda a: a.mean(0), per_device(params, x, y))


def plain_body(problem, optimizer, whole=None):
    """`auto`'s body, the same for the three strategies (only the shardings differ): the mean loss and
    gradient over the micro-batches (a scan of `device_mean`), then the optimizer, all on global arrays.
    `whole` (fsdp-jit: the parameters' shardings kept whole) constrains the parameters the loss reads to be
    whole on every device, FSDP's gather: left alone, the partitioner ran the sharded layers
    tensor-parallel on a split small model and reduced their activations' partial sums in bf16."""
    def body(params, opt_state, xs, ys):
        grad = device_mean(problem.loss_fn)

        def micro(carry, batch):
            full = params if whole is None else lax.with_sharding_constraint(params, whole)
            return jax.tree.map(jnp.add, carry, grad(full, *batch)), None

        shapes = jax.eval_shape(jax.value_and_grad(problem.loss_fn), params, xs[0, 0], ys[0, 0])
        (loss, grads), _ = lax.scan(micro, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes), (xs, ys))
        loss, grads = jax.tree.map(lambda a: a / xs.shape[0], (loss, grads))
        params, opt_state = apply_update(optimizer, grads, opt_state, params)
        return params, opt_state, loss, grads
    return body


def device_grads(loss_fn, gather, params, xs, ys):
    """`explicit`: each device's own sums over the micro-batches, nothing reduced: losses `(N@data,)` and
    gradients `(N@data, *shape)` (a vmap over the device axis: device d's rows, its own gradient). The
    carry stays sharded over `data` through the scan: no communication inside the loop. `gather(params)`
    gives the full parameters each micro-batch (fsdp-jit's all-gather; the identity for the others)."""
    vmapped = jax.vmap(jax.value_and_grad(loss_fn), in_axes=(None, 0, 0))
    shapes = per_device_shapes(loss_fn, jax.eval_shape(gather, params), xs, ys)
    # The model itself runs with the axis left to the partitioner (`auto_axes`): explicit typing has no rule
    # for some ops a model uses (an embedding's gather from sharded indices); the device axis stays split.
    per_device = auto_axes(vmapped, out_sharding=jax.tree.map(lambda _: P(AXIS), shapes))

    def micro(carry, batch):
        return jax.tree.map(jnp.add, carry, per_device(gather(params), *batch)), None

    init = jax.tree.map(lambda s: reshard(jnp.zeros(s.shape, s.dtype), P(AXIS)), shapes)
    (losses, grads), _ = lax.scan(micro, init, (xs, ys))
    return losses, grads


def per_device_shapes(loss_fn, full, xs, ys):
    """The shapes of `device_grads`' carry: a loss and a gradient per device (from one device's rows)."""
    n = xs.shape[1]
    plain = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), full)
    loss = jax.eval_shape(loss_fn, plain, *(jax.ShapeDtypeStruct(a.shape[2:], a.dtype) for a in (xs, ys)))
    grads = jax.tree.map(lambda a: jax.ShapeDtypeStruct((n, *a.shape), a.dtype), plain)
    return jax.ShapeDtypeStruct((n,), loss.dtype), grads


def sum_devices(per_device, spec_tree, count: int):
    """The devices' sums added, divided by `count` (micro-batches x N), into the layout `spec_tree`, once:
    an array kept whole: cast to `unreduced` (each device's part of the sum, no communication: a
    contraction of the device axis with a sharded vector of ones), then `reshard` to replicated: the
    all-reduce. An array split along dim d: the device axis traded for dim d (`reshard`: an all-to-all,
    (N-1)/N of it sent, a reduce-scatter's bytes), then summed locally. (From `unreduced` straight to a
    split layout, XLA:CPU emits an all-reduce and a slice: twice the bytes, measured.)"""
    def one(a, spec):
        if spec == P():
            ones = reshard(jnp.ones((a.shape[0],), a.dtype), P(AXIS))
            part = jnp.einsum("d,d...->...", ones, a, out_sharding=P(*[None] * (a.ndim - 1), unreduced={AXIS}))
            return reshard(part, P()) / count
        return jnp.sum(reshard(a, P(None, *spec)), axis=0) / count
    return jax.tree.map(one, per_device, spec_tree, is_leaf=lambda s: isinstance(s, P))


def check(problem, opts, name: str) -> None:
    """What the -jit strategies do not run, in one line naming the fix."""
    if problem.state is not None:
        raise ConfigError(f"strategy {name!r} runs no model with running statistics (BatchNorm): use ddp, zero1 "
                          "or zero3")
    if opts.reduction != "native":
        raise ConfigError(f"strategy {name!r} has reduction='native' only (the partitioner orders the sums)")


def build(row: layout_mod.Layout, problem, optimizer, mesh, opts, return_grads: bool, explicit_body) -> Strategy:
    """The strategy of layout `row`: the train state placed by its specs on a mesh of `opts.axis_type`, and
    one jitted step running `plain_body` (auto) or `explicit_body(specs)` (explicit), which returns
    (params, opt_state, loss, grads) with every array in its layout."""
    check(problem, opts, row.name)
    mesh = layout_mod.typed_mesh(mesh, opts.axis_type)
    n = mesh.size
    opt_shapes = jax.eval_shape(optimizer.init, problem.params)
    specs = {"params": layout_mod.specs(problem.params, n, row.shards_params),
             "opt_state": layout_mod.specs(opt_shapes, n, row.shards_opt_state),
             "split": layout_mod.specs(problem.params, n, True)}
    state_shardings = TrainState(layout_mod.shardings(mesh, specs["params"]),
                                 layout_mod.shardings(mesh, specs["opt_state"]))

    def init(params, opt_state=None):
        params = to_numpy(params)
        opt_state = to_numpy(optimizer.init(params) if opt_state is None else opt_state)
        return jax.device_put(TrainState(params, opt_state), state_shardings)

    explicit = opts.axis_type == "explicit"
    whole = layout_mod.shardings(mesh, layout_mod.specs(problem.params, n, False)) if row.shards_params else None
    body = explicit_body(problem, optimizer, specs, opts.accum) if explicit else plain_body(problem, optimizer, whole)

    def step(state, xs, ys):
        params, opt_state, loss, grads = body(state.params, state.opt_state, xs, ys)
        metrics = {"loss": loss, "grads": grads} if return_grads else {"loss": loss}
        if opts.nan_check:  # each array reduced where it lies: no collective added (finite.py)
            metrics["finite"] = finite.spec_flags(grads, params, *checked)
        return TrainState(params, opt_state), metrics

    checked = (specs["split" if row.shards_opt_state else "params"], specs["params"])  # the grads', the params'
    out = None if explicit else (state_shardings, {"loss": NamedSharding(mesh, P())} | (
        {"grads": layout_mod.shardings(mesh, specs["params"])} if return_grads else {}) | (
        {"finite": layout_mod.shardings(mesh, finite.flag_specs(*checked))} if opts.nan_check else {}))
    jitted = jax.jit(step, in_shardings=(state_shardings, *[NamedSharding(mesh, P(None, AXIS))] * 2),
                     out_shardings=out, donate_argnums=0)
    return Strategy(row.name, init, put_batch(mesh, opts.accum), MeshStep(jitted, mesh), lambda s: s.params)
