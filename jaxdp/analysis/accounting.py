"""Per-device memory, measured from the arrays, next to the ZeRO paper's formula.

Measured: the bytes that one device holds of the parameters, the optimizer state (both read from
the train state's addressable shards) and the synchronised gradient (read from the step's own
gradient output, in the layout the strategy keeps it: full for ddp and zero1, a shard for zero2/3),
plus the compiled step's temporary bytes (`memory_analysis()`).

Formula (ZeRO paper, Rajbhandari et al. 2020, section 5): with Psi parameters, b_p bytes per
parameter, b_g per gradient and K bytes of optimizer state per parameter,
  ddp (stage 0): (b_p + b_g + K) Psi      zero1: (b_p + b_g) Psi + K Psi / N
  zero2:          b_p Psi + (b_g + K) Psi / N      zero3: (b_p + b_g + K) Psi / N
Here Psi / N is exact: sum over parameters of ceil(size / N) (each parameter is padded to a
multiple of N), and the optimizer's replicated scalars (Adam's step count) are added to the state.
"""
from __future__ import annotations

import math
import time
from typing import NamedTuple

import jax
import numpy as np

from .. import models, strategies, train
from ..core.run import data
from ..strategies import FACTORIES, stats
from ..strategies.jit import layout as jit_layout
from ..strategies.zero import layout as zero_layout
from . import hlo
from .theory import (  # noqa: F401 (the communication theory, re-exported: callers name it here)
    BN_BACKWARD,
    BN_FORWARD,
    BN_RECOMPUTED,
    batchnorm_channels,
    batchnorm_theory,
    batchnorm_vectors,
    dp_theory,
    group_theory_for,
    inter_group_theory,
    root_sizes,
    statistics_inputs,
    stats_theory,
    stats_theory_for,
    theory,
    theory_for,
)

STAGE = {name: zero_layout.of(name).stage for name in FACTORIES} | {  # read from the layout tables
    name: row.stage for name, row in jit_layout.LAYOUTS.items()}
STATE_ARRAYS_PER_PARAM = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}


def bytes_on(tree, device) -> int:
    """Bytes of `tree`'s arrays that live on `device` (its addressable shards there)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        total += sum(s.data.nbytes for s in leaf.addressable_shards if s.device == device)
    return total


def declared_bytes_on(out_info, device) -> int | None:
    """Bytes on `device` of a lowered step's outputs `out_info` (`Lowered.out_info`), from the shardings the
    program declares (what its compiled form must return: `bytes_on` of a run gives the same, tested for every
    strategy); None where one is left to the compiler."""
    total = 0
    for leaf in jax.tree.leaves(out_info):
        sharding = getattr(leaf, "sharding", None)
        if not isinstance(sharding, jax.sharding.Sharding):
            return None
        if device in sharding.device_set:
            total += math.prod(sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
    return total


def step_memory(compiled) -> dict:
    """What a compiled step needs on one device, from `compiled.memory_analysis()`:
    state_bytes = its arguments (train state + batch shard), temp_bytes = its temporaries, and
    peak_bytes = arguments + temporaries + outputs not aliased to (donated) arguments."""
    m = compiled.memory_analysis()
    args, temp = int(m.argument_size_in_bytes), int(m.temp_size_in_bytes)
    fresh_outputs = int(m.output_size_in_bytes) - int(m.alias_size_in_bytes)
    return {"state_bytes": args, "temp_bytes": temp, "peak_bytes": args + temp + fresh_outputs}


def formula(layout: zero_layout.Layout, sizes: list[int], n: int, param_bytes: int, grad_bytes: int, k_bytes: int,
            replicated_state_bytes: int = 0) -> dict:
    """Bytes per device by the ZeRO formula, with exact padding: each part Psi / N where `layout` (a row
    of `strategies/zero/layout.py`) shards it, Psi where it does not."""
    psi = sum(sizes)
    per_device = sum(math.ceil(s / n) for s in sizes)  # Psi / N, padded
    elements = {part: per_device if sharded else psi for part, sharded in layout.sharded.items()}
    return {
        "params": param_bytes * elements["params"],
        "grads": grad_bytes * elements["grads"],
        "opt_state": k_bytes * elements["opt_state"] + replicated_state_bytes,
    }


class CompiledStep(NamedTuple):
    """`cfg`'s step compiled once, to be read (HLO text, memory and cost analyses) or run once."""
    devices: list
    problem: models.Problem
    optimizer: object
    strategy: object
    state: object      # the initial train state (the step donates it: run `program` at most once)
    batch: tuple       # step 1's batch, placed as the step takes it (`step_batch`)
    program: object    # the compiled step (jax.stages.Compiled)
    lower_s: float
    compile_s: float
    stats_program: object = None  # a model with running statistics: their forward-only program, compiled
    stats_sizes: tuple = ()       # ... and the sizes of the parameters it reads (`statistics_inputs`)


def step_batch(cfg, par, dataset, step: int) -> tuple:
    """Step `step`'s global batch in the one layout of `jaxdp.parallelize`'s step, as NumPy
    (`data.micro_major`: micro-batch j is rows [jB/A, (j+1)B/A), device d holds its d-th chunk);
    `par.put_batch(*step_batch(...))` places it."""
    x, y = train.host_batch(cfg, dataset, step)
    return tuple(data.micro_major(a, len(par.mesh.local_devices), cfg.accum) for a in (x, y))


def compile_step(cfg, return_grads: bool = False, lower_only: bool = False) -> CompiledStep:
    """Build `cfg`'s run (`train.prepare`), place the initial state and step 1's batch, then lower and
    compile the jitted step, timing each; with running statistics (BatchNorm), also compile their
    forward-only program (`strategies.stats`), which the train step runs without (`batch_stats` None).
    `lower_only`: `program` is the lowered step (jax.stages.Lowered), nothing compiled."""
    devices, dataset, problem, optimizer, strategy = train.prepare(cfg, return_grads)
    state = strategy.init(problem.params)
    host = step_batch(cfg, strategy, dataset, 1)
    batch = strategy.put_batch(*host)
    stats_program, stats_sizes = None, ()
    if state.batch_stats is not None:
        stats_program = None if lower_only else _compile_stats(strategy, state, batch[0], host, cfg)
        stats_sizes = tuple(statistics_inputs(problem, host[0]))
        state = state._replace(batch_stats=None)  # as parallelize's step passes it
    t0 = time.perf_counter()
    lowered = strategy.compiled_step.lower(state, *batch)
    t1 = time.perf_counter()
    program = lowered if lower_only else lowered.compile()
    return CompiledStep(devices, problem, optimizer, strategy, state, batch, program, t1 - t0,
                        time.perf_counter() - t1, stats_program, stats_sizes)


def _compile_stats(par, state, x, host, cfg):
    """The running statistics' program as `jaxdp.parallelize` runs it (api._with_state), compiled
    (`cfg.reduction` and `cfg.shards` choose canonical statistics or not)."""
    program = stats.make(par.name, par.problem, par.mesh, par.accum, cfg)
    params, x = strategies.stats_inputs(par.name, par.full_params, state, x, host, par.mesh)
    return program.lower(params, state.batch_stats, x).compile()


def memory(cfg, trains: CompiledStep | None = None, temporaries: bool = True) -> dict:
    """Measure one step of `cfg` on device 0 of its mesh and set it next to the formula: parameters and optimizer
    state from the placed arrays, the gradient from the output shardings a step that also returns it declares
    when lowered (`declared_bytes_on`; compiled and run only where one is left to the compiler); `temp_bytes`
    and `peak_bytes` (`step_memory`) from the step that trains (`trains`, compiled here when not given), or None
    with `temporaries=False` (nothing compiled for them: what a caller reading only the state's bytes needs)."""
    c = compile_step(cfg, return_grads=True, lower_only=True)
    device = c.devices[0]
    # the state's bytes first: the step donates its state (every strategy, `single` included), so after it
    # runs `c.state`'s arrays are deleted and only the step's outputs may be read
    measured = {"params": bytes_on(c.state.params, device), "opt_state": bytes_on(c.state.opt_state, device)}
    grads = declared_bytes_on(c.program.out_info[1]["grads"], device)
    if grads is None:
        _, metrics = c.program.compile()(c.state, *c.batch)
        grads = bytes_on(metrics["grads"], device)
    measured = {"params": measured["params"], "grads": grads, "opt_state": measured["opt_state"]}

    step = step_memory((trains or compile_step(cfg)).program) if temporaries else dict(temp_bytes=None, peak_bytes=None)
    return {"strategy": cfg.strategy, "devices": cfg.devices, **formula_for(cfg, c.problem, c.optimizer),
            "measured": measured, "temp_bytes": step["temp_bytes"], "peak_bytes": step["peak_bytes"]}


def formula_for(cfg, problem, optimizer) -> dict:
    """`psi`, `sizes`, `k_bytes`, `param_bytes` and the ZeRO `formula` (bytes per device of params, grads and
    optimizer state) of `cfg`'s strategy, from the parameters' shapes alone."""
    itemsize = np.dtype(models.MASTER_DTYPE[cfg.dtype]).itemsize
    sizes = [int(np.prod(p.shape)) for p in jax.tree.leaves(problem.params)]
    scalars = sum(leaf.dtype.itemsize for leaf in jax.tree.leaves(jax.eval_shape(optimizer.init, problem.params))
                  if leaf.ndim == 0)
    k_bytes = STATE_ARRAYS_PER_PARAM[cfg.optimizer] * itemsize
    shards = cfg.devices // cfg.replicas  # hsdp: sharded over a group of S = N / R (zero3's formula at S)
    if cfg.strategy in jit_layout.LAYOUTS:  # each array sharded by its shape, whole where N divides no dim
        shapes = [p.shape for p in jax.tree.leaves(problem.params)]
        expected = jit_layout.formula(jit_layout.LAYOUTS[cfg.strategy], shapes, shards, itemsize, itemsize, k_bytes,
                                      scalars, cfg.axis_type)
    else:
        expected = formula(zero_layout.of(cfg.strategy), sizes, shards, itemsize, itemsize, k_bytes, scalars)
    return {"psi": sum(sizes), "sizes": sizes, "k_bytes": k_bytes, "param_bytes": itemsize, "formula": expected}


def measure_step(cfg) -> dict:
    """What the reports (`compare`, `bench`) read from `cfg`'s compiled step: `memory` (whose gradient
    comes from a second program that returns it), and from the step that trains (no trace outputs)
    its communication by kind (`communication`), its temporary bytes and its lowering / compile times."""
    c = compile_step(cfg)
    comm = communication(c.program.as_text(), cfg.devices)
    mem = step_memory(c.program)
    trains = {"comm": comm, "temp_bytes": mem["temp_bytes"], "peak_bytes": mem["peak_bytes"], "lower_s": c.lower_s,
              "compile_s": c.compile_s}
    out = {**memory(cfg, c), **trains}
    channels = batchnorm_channels(c.problem)
    shapes = [p.shape for p in jax.tree.leaves(c.problem.params)]
    inputs = {"sizes": out["sizes"], "root": root_sizes(c.problem), "channels": channels, "shapes": shapes}
    out["theory"] = theory_for(cfg, **inputs)
    out["theory_inputs"] = inputs  # theory_for(cfg.replace(devices=n), **inputs): the theory at another N
    out["comm_groups"] = group_bytes(collectives(c.program.as_text(), cfg.devices), cfg.devices, cfg.replicas)
    out["theory_groups"] = group_theory_for(cfg, out["sizes"], root_sizes(c.problem), channels, shapes)
    if c.stats_program is not None:  # the running statistics' own program, apart from the train step
        out["stats_comm"] = communication(c.stats_program.as_text(), cfg.devices)["total"]
        out["stats_theory"] = stats_theory_for(cfg, list(c.stats_sizes), channels)["total"]
    from ..contract import strategies as contract  # the textbook beside the program (docs/CHECK.md)

    out["contract"] = contract.of_compiled(c, cfg).to_dict()
    return out


def format_memory(rows: list[dict]) -> str:
    lines = [
        f"{'strategy':<10} {'N':>3} {'params':>10} {'grads':>10} {'opt state':>10} {'formula p/g/o':>28} {'temp':>9}"
        f" {'peak':>10}"
    ]
    for r in rows:
        m, f = r["measured"], r["formula"]
        lines.append(
            f"{r['strategy']:<10} {r['devices']:>3} {m['params']:>10} {m['grads']:>10} {m['opt_state']:>10} "
            f"{f['params']:>9}/{f['grads']}/{f['opt_state']:<9} {r['temp_bytes']:>9} {r['peak_bytes']:>10}"
        )
    return "\n".join(lines)


# ---- communication, read from the compiled program ----------------------------------------------

KINDS = {
    "all-reduce": "all-reduce",
    "reduce-scatter": "reduce-scatter",
    "all-gather": "all-gather",
    "collective-permute": "point-to-point",
}


def collectives(hlo_text: str, n_devices: int) -> list[dict]:
    """Every collective of a compiled (post-optimisation) HLO module, in program order
    (`hlo.collectives_in_order`): its kind, the bytes of its result, its group size, `trips` (the
    times it runs per step: inside a while loop, the loop's trip count; nested loops multiply) and
    the bytes each device sends per run by the ring algorithm:
      all-reduce of B bytes          2 (n-1)/n B      reduce-scatter to B bytes   (n-1) B
      all-gather to B bytes          (n-1)/n B        collective-permute of B     B per sending pair / n
      all-to-all of B bytes          (n-1)/n B
    (for collective-permute: the mean over devices; `max_sent` is the busiest device's)."""
    found = []
    for c in hlo.collectives_in_order(hlo_text, n_devices):
        op, nbytes, n = c["op"], c["bytes"], c["group"]
        if op == "collective-permute":
            senders = [s for s, _ in c["pairs"]]
            sent = nbytes * len(senders) / n_devices
            max_sent = nbytes * max((senders.count(d) for d in set(senders)), default=0)
        else:
            sent = max_sent = {"all-reduce": 2 * (n - 1) / n * nbytes, "reduce-scatter": (n - 1) * nbytes,
                               "all-gather": (n - 1) / n * nbytes, "all-to-all": (n - 1) / n * nbytes}[op]
        found.append({**c, "kind": KINDS.get(op, op), "sent": sent, "max_sent": max_sent})
    return found


def communication(hlo_text: str, n_devices: int) -> dict:
    """Bytes sent per device per step, by kind of collective, and the number of ops of each kind
    that run per step (an op inside a loop counts once per iteration)."""
    out = {kind: {"ops": 0, "sent": 0.0, "max_sent": 0.0} for kind in KINDS.values()}
    for c in collectives(hlo_text, n_devices):
        trips = 1 if c["trips"] is None else c["trips"]  # a loop of unknown trip count: counted once
        entry = out.setdefault(c["kind"], {"ops": 0, "sent": 0.0, "max_sent": 0.0})
        entry["ops"] += trips
        entry["sent"] += c["sent"] * trips
        entry["max_sent"] += c["max_sent"] * trips
    out["total"] = sum(v["sent"] for v in out.values())
    return out


def crosses_groups(c: dict, shard: int) -> bool:
    """Whether collective `c` (`hlo.collective`) runs across hsdp's groups: a device group of it holds
    devices of more than one shard group (device k is in group k // S, S = `shard`)."""
    return any(len({d // shard for d in g}) > 1 for g in c["groups"])


def group_bytes(found: list[dict], n_devices: int, replicas: int = 1) -> dict:
    """Bytes sent per device per step (`collectives`' `sent` x trips), split into `bytes_intra_group`
    (collectives whose device groups lie within a shard group of S = N / R devices) and
    `bytes_inter_group` (the others: across hsdp's replica groups). R = 1: one group, all within."""
    shard = n_devices // replicas
    out = {"bytes_intra_group": 0.0, "bytes_inter_group": 0.0}
    for c in found:
        key = "bytes_inter_group" if crosses_groups(c, shard) else "bytes_intra_group"
        out[key] += c["sent"] * (1 if c["trips"] is None else c["trips"])
    return out


def step_communication(strategy, state, batch, n_devices: int) -> dict:
    """`communication` of a strategy's compiled step."""
    return communication(strategy.compiled_step.lower(state, *batch).compile().as_text(), n_devices)
