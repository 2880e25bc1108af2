"""Can an optax transformation run on ZeRO's layout? ZeRO applies the optimizer to every parameter
flattened and zero-padded to a multiple of N (`strategies/zero/flat.py`). An element-wise transformation
(Adam, SGD, weight decay, global-norm clipping...) computes the same update there as on the true
shapes; one that reads the shapes (matrix orthogonalisation as in `optax.contrib.muon`, a mask by
rank, a per-row norm) does not, or fails on 1-D arrays.

The probe: two updates on small random values, on the host CPU, in both layouts, compared.
"""
from __future__ import annotations

import jax
import numpy as np
import optax

from .core.run.config import ConfigError

PROBE_DIM = 512  # a dimension above this is cut to it: shape thresholds (adafactor's 128) stay visible
WHOLE = 1 << 20  # a parameter of at most this many elements is probed at its true shape (padding included)
# The probe runs once on a few values: how fast its machine code is does not matter, how long it compiles does.
PROBE_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
# State types of transformations known to be element-wise (not named in the error).
ELEMENTWISE_STATES = {"EmptyState", "ScaleByAdamState", "ScaleByScheduleState", "TraceState", "ScaleByRmsState",
                      "ScaleByRStdDevState", "ScaleByBeliefState", "ScaleByLionState", "MaskedState",
                      "InjectHyperparamsState", "InjectStatefulHyperparamsState", "ScaleByAmsgradState",
                      "PartitionState", "MaskedNode"}  # (the last two: structure, named by what they hold)


class Elementwise(optax.GradientTransformationExtraArgs):  # what optax.chain returns
    """An optax transformation built of element-wise parts only, as `jaxdp.optim.make` builds its optimizers
    (clipping by the global norm, weight decay, SGD, momentum, Adam, AdamW): `check_elementwise` trusts it without
    the probe (tests/jaxdp/test_api.py probes every one `make` builds, and they pass)."""
    __slots__ = ()


class ShapeDependentOptimizer(ConfigError):
    """An optax transformation that cannot run on ZeRO's flat shards; the message names it."""


def state_types(state) -> list[str]:
    """The class names of the NamedTuple nodes of an optax state, in order, each once."""
    names: list[str] = []

    def walk(node):
        if isinstance(node, tuple) and hasattr(node, "_fields"):
            names.append(type(node).__name__)
        if isinstance(node, (tuple, list)):
            for child in node:
                walk(child)
        elif isinstance(node, dict):
            for child in node.values():
                walk(child)

    walk(state)
    return list(dict.fromkeys(names))


def _flat(tree, n):
    return jax.tree.map(lambda a: np.pad(a.reshape(-1), (0, -a.size % n)), tree)


def _updates(optimizer, params, grads):
    """The optimizer's updates for `grads` in turn from `params`, and its last state: one program, compiled
    with LLVM's optimisations off (PROBE_COMPILE). Run op by op, as it was, each operation compiled once per
    shape: for 49 tensors with AdamW and clipping, 5.3 s of a ZeRO run's start against 2.4 s so (2-core CPU)."""
    def run(params, grads):
        state = optimizer.init(params)
        out = []
        for g in grads:
            updates, state = optimizer.update(g, state, params)
            out.append(updates)
            params = jax.tree.map(lambda p, u: p + u, params, updates)
        return out, state

    return jax.jit(run).lower(params, grads).compile(compiler_options=PROBE_COMPILE)(params, grads)


def check_elementwise(optimizer, params, n: int) -> None:
    """Raise `ShapeDependentOptimizer` when `optimizer`'s update on the flat padded layout (N = n)
    differs from its update on the true shapes. An `Elementwise` one is not probed."""
    if isinstance(optimizer, Elementwise):
        return
    rng = np.random.default_rng(0)

    def small(p):
        shape = np.shape(p)
        if np.prod(shape) > WHOLE:
            shape = tuple(min(d, PROBE_DIM) for d in shape)
        return rng.standard_normal(shape).astype(np.float32)

    probe = jax.tree.map(small, params)
    grads = [jax.tree.map(small, params) for _ in range(2)]
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        want, state = _updates(optimizer, probe, grads)
        try:
            got, _ = _updates(optimizer, _flat(probe, n), [_flat(g, n) for g in grads])
            differs = _first_difference(want, got)
        except Exception as e:  # noqa: BLE001 - any failure on 1-D shards means the same thing
            differs = f"it fails on the flat layout ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    if differs:
        types = state_types(state)
        named = [t for t in types if t not in ELEMENTWISE_STATES] or types
        raise ShapeDependentOptimizer(
            f"the optimizer is shape-dependent (state types: {', '.join(named) or 'none'}): {differs}; ZeRO "
            f"updates flat padded shards, so use a replicated strategy (ddp, ddp-bucket, ddp-ring) with it")


def _first_difference(want, got) -> str | None:
    for k, (a_step, b_step) in enumerate(zip(want, got, strict=True)):
        for (path, a), b in zip(jax.tree.flatten_with_path(a_step)[0], jax.tree.leaves(b_step), strict=True):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)[:a.size].reshape(a.shape)
            if not np.allclose(a, b, rtol=1e-4, atol=1e-6 * max(1.0, np.abs(a).max(initial=0))):
                return f"its update {k + 1} of {jax.tree_util.keystr(path)} differs on the flat layout"
    return None
