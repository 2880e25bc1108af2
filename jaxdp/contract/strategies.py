"""The contract of the project's own strategies: their compiled step judged against the layout each stands
for (`core/contract/intent.OF_STRATEGY`), so `jaxdp inspect` and `jaxdp compare` print the textbook beside
the program."""
from __future__ import annotations

import numpy as np

from ..core.contract.intent import of_strategy
from ..core.contract.report import Report
from ..core.registry import strategies as registry
from ..core.run import data
from . import check


def of_parallel(par, state, x, y, reduce_dtype: str = "float32", master_dtype: str = "float32") -> Report:
    """`jaxdp.parallelize`'s strategy `par` (its state, and one global batch x, y as NumPy) checked against
    its layout: the step `par.step` runs, compiled as it runs it."""
    local = len(par.mesh.local_devices)
    xb, yb = par.put_batch(*(data.micro_major(np.asarray(a), local, par.accum) for a in (x, y)))
    state = state if getattr(state, "batch_stats", None) is None else state._replace(batch_stats=None)
    want = of_strategy(par.name, par.accum, reduce_dtype, _replicas(par), master_dtype)
    args = (state, xb, yb)
    compiled = par.compiled_step.lower(*args).compile()
    return _judged(compiled, args, par.name, par.problem.params, par.mesh, want)


def _judged(compiled, args, name: str, params, mesh, want) -> Report:
    """The report of a strategy's compiled step: P from the model's (unsharded) parameters; where the state
    lives from the shardings the program takes it with (ddp-pmap's stacked copies, one per device, are
    replicas, not shards)."""
    text, pmap = compiled.as_text(), registry.get(name, "per_device", False)
    params_in, state = check.parts(args)
    return check.of_program(text, *check.mesh_shape(text, check.mesh_of(args) or mesh), want,
                            check.sizes(params), False if pmap else check.sharded(compiled, args, state),
                            False if pmap else check.sharded(compiled, args, params_in),
                            check.held(params_in, state))


def of_compiled(step, cfg) -> Report:
    """The contract of `accounting.compile_step(cfg)`'s program (inspect's, compare's), not compiled again."""
    from ..models import MASTER_DTYPE

    master = np.dtype(MASTER_DTYPE[cfg.dtype]).name
    want = of_strategy(cfg.strategy, cfg.accum, master, cfg.replicas, master, cfg.inner_steps)  # kept where it applies
    return _judged(step.program, (step.state, *step.batch), cfg.strategy, step.problem.params,
                   getattr(step.strategy, "mesh", None), want)


def note(contract: dict) -> str:
    """A report's dict in a few words, for a line of `jaxdp compare`: '; contract kept' or its departures."""
    if contract["ok"]:
        return f"; contract {contract['intent']} kept"
    return f"; contract {contract['intent']} DEPARTS: " + ", ".join(f["kind"] for f in contract["findings"])


def _replicas(par) -> int:
    if not registry.get(par.name, "grid", False):
        return 0
    return int(dict(zip(par.mesh.axis_names, par.mesh.devices.shape, strict=True)).get("replica", 1))
