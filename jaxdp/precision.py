"""Where a JAX run computes below its own dtype: the precision census read from a step's jaxpr, the twin of
torch_ref/precision.py, in the same shape (jaxdp/core/traces/census.py; the trace's meta `precision`, docs/TRACE.md).

    census = jaxdp.precision.census(jax.value_and_grad(loss_fn), params, x, y)   # shapes only: nothing runs
    with jaxdp.trace.Recorder("run.npz", {"dtype": "float64", "precision": census, ...}) as rec:
        ...

Every equation of the jaxpr (and of the jaxprs inside it: jit, shard_map, scan, custom_vjp...) whose floating
outputs (else inputs) are of a dtype lower than the run's is a site, named by its equation's name stack (a
`jax.named_scope`; empty for Flax NNX modules, which push none) else its source line, and the class whose method
made it (`RMSNorm.__call__` -> `RMSNorm`); equations under `transpose(...)` in the name stack are the backward's.
Structural equations (reshapes, broadcasts, slices) compute nothing and are not counted. `jaxdp train` records
the census of its model's loss and gradient by itself.
"""
from __future__ import annotations

import copy
from collections import Counter

import numpy as np

from .core.traces import census as census_mod

KEY = census_mod.KEY
STRUCTURAL = {"broadcast_in_dim", "reshape", "transpose", "squeeze", "expand_dims", "slice", "dynamic_slice",
              "dynamic_update_slice", "concatenate", "gather", "select_n", "copy", "copy_p", "iota", "split", "pad",
              "rev", "pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
              "custom_vjp_call_jaxpr", "shard_map", "scan", "while", "cond", "remat", "checkpoint"}


def run_dtype(args) -> str:
    """The most common floating dtype of the leaves of `args`, by elements (float32 when none is floating)."""
    import jax

    count: Counter = Counter()
    for leaf in jax.tree.leaves(args):
        dtype = np.dtype(getattr(leaf, "dtype", np.asarray(leaf).dtype))
        if np.issubdtype(dtype, np.floating) or dtype.name == "bfloat16":
            count[dtype.name] += int(np.prod(np.shape(leaf)))
    return count.most_common(1)[0][0] if count else "float32"


def census(fn, *args, dtype: str | None = None, **kwargs) -> dict:
    """The census of `fn(*args, **kwargs)` (traced, never run: arrays stand for their shapes and dtypes) in a run
    of `dtype` (default: the arguments' most common floating dtype)."""
    import jax

    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype) if hasattr(a, "dtype") else a,
                          (args, kwargs))
    closed = jax.make_jaxpr(lambda a, k: fn(*a, **k))(*shapes)
    run = dtype or run_dtype(args)
    counts: Counter = Counter()
    seen: set = set()
    _walk(closed.jaxpr, run, counts, seen)
    return census_mod.summary(run, counts, seen)


def of_problem(problem, x, y, dtype: str | None = None) -> dict:
    """The census of a `jaxdp.models.Problem`'s loss and gradient on a batch like (x, y): `jaxdp train`'s."""
    import jax

    return census(jax.value_and_grad(problem.loss_fn), problem.params, x, y, dtype=dtype)


MODEL_FIELDS = ("model", "data", "dtype", "hidden", "channels", "batchnorm", "conv_bias", "n_layer", "n_head",
                "n_kv_head", "d_model", "d_ff", "seq_len", "preset", "kernels")
_RUNS: dict = {}  # a process's `of_run` censuses, by the fields that make the model and the batch's shape


def of_run(cfg, problem, x, y) -> dict:
    """`jaxdp train`'s census: `of_problem` for `cfg`'s model, traced once per model and batch shape a process."""
    key = (tuple(repr(getattr(cfg, f, None)) for f in MODEL_FIELDS), np.shape(x), np.shape(y))  # lists too
    if key not in _RUNS:
        _RUNS[key] = of_problem(problem, x, y, cfg.dtype)
    return copy.deepcopy(_RUNS[key])


def _walk(jaxpr, run: str, counts: Counter, seen: set) -> None:
    for eqn in jaxpr.eqns:
        for sub in _subjaxprs(eqn.params):
            _walk(sub, run, counts, seen)
        name = eqn.primitive.name
        if name in STRUCTURAL:
            continue
        dtype = census_mod.lowest(_floats(eqn.outvars)) or census_mod.lowest(_floats(eqn.invars))
        if dtype is None:
            continue
        seen.add(dtype)
        if census_mod.lower(dtype, run):
            counts[(*_where(eqn), name, dtype, _phase(eqn))] += 1


def _floats(variables) -> list[str]:
    out = []
    for v in variables:
        dtype = getattr(getattr(v, "aval", None), "dtype", None)
        if dtype is not None and (np.issubdtype(dtype, np.floating) or np.dtype(dtype).name == "bfloat16"):
            out.append(np.dtype(dtype).name)
    return out


def _subjaxprs(params: dict):
    for value in params.values():
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if hasattr(v, "eqns"):
                yield v
            elif hasattr(v, "jaxpr") and hasattr(v.jaxpr, "eqns"):
                yield v.jaxpr


def _stack(eqn) -> str:
    return str(getattr(eqn.source_info, "name_stack", ""))


def _phase(eqn) -> str:
    return "backward" if "transpose" in _stack(eqn) else "forward"


def _where(eqn) -> tuple[str, str]:
    """(module, class): the name stack's scopes (without jvp/transpose wrappers), else the user's source line;
    the class of the method that made the equation ('' for a plain function)."""
    from jax._src import source_info_util

    scopes = [s for s in _stack(eqn).replace(")", "").replace("(", "/").split("/")
              if s and s not in ("jvp", "transpose")]
    frame = source_info_util.user_frame(eqn.source_info.traceback) if eqn.source_info.traceback else None
    function = frame.function_name if frame is not None else ""
    line = f"{frame.file_name.rsplit('/', 1)[-1]}:{frame.start_line}" if frame is not None else ""
    cls = function.split(".")[0] if "." in function and "<locals>" not in function.split(".")[0] else ""
    return "/".join(scopes) or line, cls
