"""`jaxdp.check(fn, *args, intent=...)`: compile a user's jitted step with its arguments (their shardings say
where everything lives), read every collective of the compiled program, and judge it against the intent.

    report = jaxdp.check(train_step, params, opt_state, batch, intent="zero1", reduce_dtype="float32",
                         master_dtype="float32")
    report.ok, report.findings          # each finding: .kind, .message, .fix
    print(report); report.to_json()

Which arguments are what: the first argument is the parameters, the second (if any) the optimizer state; or
the first is a train state with `params` and `opt_state` (attributes or keys). P, the parameters' elements,
scales every verdict (jaxdp/core/contract/judge.py); the optimizer state's shardings say whether ZeRO's state
is sharded. The floating arrays of the parameters and of the optimizer state (its scalars aside) must be held
in `master_dtype` (jaxdp/core/contract/master.py). The data-parallel devices are all the program's devices (the
mesh's, or the compiled program's partitions)."""
from __future__ import annotations

import re

import jax
import numpy as np

from ..analysis import theory
from ..core.contract import judge, master
from ..core.contract.intent import GRID, Intent
from ..core.contract.report import Report
from ..core.registry import strategies as registry
from . import read


def check(fn, *args, intent: str = registry.DEFAULT, accumulation: int = 1, reduce_dtype: str = "float32",
          replicas: int = 0, mesh=None, master_dtype: str = "float32", inner_steps: int = 1) -> Report:
    """The contract of `fn(*args)` (jitted, or jitted here) against `intent` (module docstring)."""
    want = Intent(intent, accumulation, reduce_dtype, replicas, master_dtype, inner_steps)
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    compiled = jitted.lower(*args).compile()
    params, state = parts(args)
    return of_program(compiled.as_text(), *mesh_shape(compiled.as_text(), mesh or mesh_of(args)), want,
                      sizes(params), sharded(compiled, args, state), sharded(compiled, args, params),
                      held(params, state))


def mesh_shape(text: str, mesh) -> tuple[tuple, tuple]:
    """(shape, axis names) of `mesh`; without one, the compiled program's partitions as one axis."""
    if mesh is not None:
        return tuple(mesh.devices.shape), tuple(mesh.axis_names)
    m = re.search(r"num_partitions=(\d+)", text)
    return (int(m.group(1)) if m else 1,), ("devices",)


def of_program(text: str, shape, names, want: Intent, param_sizes: list[int], state_sharded: bool | None = None,
               params_sharded: bool | None = None, held_dtypes: dict | None = None) -> Report:
    """The report for a compiled program's text on a mesh of `shape` with axes `names` (also used for the
    project's own strategies: `jaxdp.contract.strategies`); `held_dtypes` as `held` returns it."""
    comms = read.comms(text, tuple(shape), tuple(names))
    devices, p = int(np.prod(shape)), sum(param_sizes)
    facts = {"accumulation": want.accumulation, "reduce_dtype": want.reduce_dtype,
             "master_dtype": want.master_dtype, "held_dtypes": {k: sorted(v) for k, v in (held_dtypes or {}).items()},
             "devices": devices, "mesh": dict(zip(names, map(int, shape), strict=True)), "param_elements": p,
             # a conditional's branch (diloco's outer step) runs once every `inner_steps` steps
             "bytes_per_step": sum(judge.sent(c) / (want.inner_steps if c.branch else 1) for c in comms),
             "theory_bytes_per_step": textbook(want, param_sizes, devices)}
    found = master.findings(held_dtypes or {}, want) + judge.findings(comms, want, devices, p, state_sharded,
                                                                      params_sharded)
    return Report(want.name, comms, found, facts)


def textbook(want: Intent, param_sizes: list[int], devices: int) -> float | None:
    """Bytes per device per step the intent's textbook algorithms send (analysis/theory.py, ring), or None
    where it has none (hsdp without its replica count)."""
    if want.name in GRID and not want.replicas:
        return None
    itemsize = np.dtype(want.reduce_dtype if want.reduce_dtype != "bfloat16" else np.float16).itemsize
    return theory.theory(want.name, param_sizes, devices, itemsize, accum=want.accumulation,
                         replicas=want.replicas or 1, inner_steps=want.inner_steps)["total"]


def mesh_of(args):
    """The mesh of the first argument leaf placed with a NamedSharding (None if none is)."""
    for leaf in jax.tree.leaves(args):
        mesh = getattr(getattr(leaf, "sharding", None), "mesh", None)
        if mesh is not None and hasattr(mesh, "devices"):
            return mesh
    return None


def _field(x, name: str):
    return x.get(name) if isinstance(x, dict) else getattr(x, name, None)


def parts(args) -> tuple:
    """(parameters, optimizer state or None) among `args` (module docstring)."""
    if not args:
        return (), None
    first = args[0]
    if _field(first, "params") is not None:
        return _field(first, "params"), _field(first, "opt_state")
    return first, args[1] if len(args) > 1 else None


def sizes(tree) -> list[int]:
    """Elements of each floating array of `tree`."""
    return [int(np.prod(np.shape(x))) for x in jax.tree.leaves(tree)
            if jax.dtypes.issubdtype(getattr(x, "dtype", np.float32), np.floating)]


def held(params, state) -> dict[str, set[str]]:
    """{"parameters": their floating dtypes, "optimizer state": its arrays' (scalars aside)} by name."""
    out = {"parameters": _floats(params, 0)}
    if state is not None:
        out["optimizer state"] = _floats(state, 1)
    return {k: v for k, v in out.items() if v}


def _floats(tree, ndim: int) -> set[str]:
    return {master.name(np.dtype(x.dtype)) for x in jax.tree.leaves(tree) if len(np.shape(x)) >= ndim
            and jax.dtypes.issubdtype(getattr(x, "dtype", np.int32), np.floating)}


def sharded(compiled, args, tree) -> bool | None:
    """Whether some array of `tree` (the optimizer state, the parameters; arrays of at least 2 elements) is
    sharded, by the shardings the compiled program takes it with; None without one."""
    if tree is None:
        return None
    ids = {id(x) for x in jax.tree.leaves(tree) if np.size(x) > 1}
    try:
        given = jax.tree.leaves(compiled.input_shardings[0])
        pairs = list(zip(jax.tree.leaves(args), given, strict=True))
    except (TypeError, ValueError, AttributeError):
        pairs = [(x, getattr(x, "sharding", None)) for x in jax.tree.leaves(args)]
    found = [s for x, s in pairs if id(x) in ids and s is not None]
    if not found:
        return None
    return any(not s.is_fully_replicated for s in found)
