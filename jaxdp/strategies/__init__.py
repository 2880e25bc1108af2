"""The strategies, one small module each, all with the same interface (`common.Strategy`).

A factory is `make(problem, optimizer, mesh, options, return_grads)`; `options` is a
`StrategyOptions`: the few values strategies read, with `jaxdp train`'s defaults.
"""
from __future__ import annotations

from typing import NamedTuple

from ..core.registry import strategies as registry
from ..core.run.config import ALIASES, AXIS_TYPES, FRAMEWORK_STRATEGIES, ConfigError
from ..core.run.hsdp_hosts import HOSTS
from ..core.run.reduction import REDUCTIONS
from . import ddp_pmap, zero
from .common import Strategy, TrainState


class StrategyOptions(NamedTuple):
    accum: int = 1                      # micro-batches per step, one sync per step
    bucket_mb: float = 25.0             # ddp-bucket: bucket capacity in MB (2**20 bytes)
    collectives: str = "xla"            # zero1/2/3: "xla" (built-ins) or "ring" (jaxdp.collectives)
    reshard_after_forward: bool = True  # zero3: free each unit's gathered parameters after its forward
    reduction: str = "native"           # "canonical": the same bits on any N dividing `shards` (canonical/)
    shards: int = 0                     # canonical: shards per micro-batch (0: canonical.default_shards)
    clip_norm: float = 0.0              # canonical: clip the canonical global norm (native: in the optax chain)
    replicas: int = 1                   # hsdp: R groups of N / R devices (zero3 within a group, replicated across)
    hsdp_hosts: str = "shard"           # hsdp: the grid's order, row-major ("shard") or column-major ("replica")
    axis_type: str = "auto"             # -jit: the mesh's jax.sharding.AxisType, "auto" or "explicit" (jit/step.py)
    nan_check: bool = True              # every strategy: the step's fused non-finite check (finite.py)
    inner_steps: int = 4                # diloco: K local steps between outer steps
    outer_lr: float = 0.7               # diloco: the outer SGD's learning rate (the paper's 0.7)
    outer_momentum: float = 0.9         # diloco: the outer SGD's Nesterov momentum (the paper's 0.9; 0: plain SGD)


FACTORIES = registry.factories("jax")  # one row per strategy: jaxdp/core/registry/strategies.py
assert tuple(FACTORIES) == FRAMEWORK_STRATEGIES["jax"]

# The options each strategy reads besides `accum` (every one accumulates) and the reduction's.
REDUCTION_OPTIONS = ("reduction", "shards", "clip_norm")
OPTIONS = {name: registry.entry(name).jax_options for name in FACTORIES}


# A saved (checkpointed) array of strategy `name` -> the full array: ddp-pmap's per-device copies, ZeRO's
# flat padded shards (`zero/layout.py`); the others save full arrays.
PER_DEVICE = registry.names("jax", per_device=True)  # ddp-pmap
HOST_FULL = {name: ddp_pmap.host_full for name in PER_DEVICE} | {name: zero.flat.host_full for name in zero.LAYOUTS}


def host_full(name: str, a, like):
    """`a`, saved by strategy `name`, as the full array shaped like `like`."""
    return HOST_FULL.get(name, lambda a, like: a)(a, like)


# The running statistics' program's inputs (`stats.py`): the train state's parameters and the placed rows,
# except where the strategy's state is laid out otherwise (ddp-pmap's per-device stacks).
STATS_INPUTS = {name: ddp_pmap.stats_inputs for name in PER_DEVICE}
ONE_DEVICE = registry.names("jax", one_device=True)  # strategies that run on one device, not over a mesh


def stats_inputs(name: str, full_params, state, x_placed, host, mesh):
    """(params, x) for strategy `name`'s running-statistics program: `host` the step's (x, y) as NumPy,
    `x_placed` its x as the strategy's `put_batch` placed it."""
    if name in STATS_INPUTS:
        return STATS_INPUTS[name](full_params, state, x_placed, host, mesh)
    return state.params, x_placed


def resolve(name: str) -> str:
    """`name` with its alias resolved (`fsdp` -> `zero3`); an unknown name is one line listing the valid."""
    name = ALIASES.get(name, name)
    if name not in FACTORIES:
        raise ConfigError(f"unknown strategy {name!r}; valid: {', '.join(FACTORIES)}, fsdp (= zero3)")
    return name


def options(name: str, accum: int = 1, **given) -> StrategyOptions:
    """The options of strategy `name`: `given` checked against the ones it reads."""
    name = resolve(name)
    unknown = sorted(set(given) - set(OPTIONS[name]) - set(REDUCTION_OPTIONS) - {"nan_check"})
    if unknown:
        valid = ", ".join(OPTIONS[name]) or "none"
        raise ConfigError(f"strategy {name!r} takes no option {', '.join(unknown)}; its options: {valid}")
    if given.get("hsdp_hosts", "shard") not in HOSTS:
        raise ConfigError(f"hsdp_hosts={given['hsdp_hosts']!r}; valid: {', '.join(HOSTS)}")
    if given.get("axis_type", "auto") not in AXIS_TYPES:
        raise ConfigError(f"axis_type={given['axis_type']!r}; valid: {', '.join(AXIS_TYPES)}")
    if given.get("collectives", "xla") not in ("xla", "ring"):
        raise ConfigError(f"collectives={given['collectives']!r}; valid: xla, ring")
    if given.get("reduction", "native") not in REDUCTIONS:
        raise ConfigError(f"reduction={given['reduction']!r}; valid: {', '.join(REDUCTIONS)}")
    if given.get("reduction", "native") == "native" and (given.get("clip_norm") or given.get("shards")):
        raise ConfigError("clip_norm= and shards= are for reduction='canonical'; with 'native', put the clip in "
                          "the optax chain")
    replicas = given.get("replicas", 1)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ConfigError(f"replicas={replicas!r}; give a whole number of groups >= 1 that divides the devices")
    inner = given.get("inner_steps", 1)
    if isinstance(inner, bool) or not isinstance(inner, int) or inner < 1:
        raise ConfigError(f"inner_steps={inner!r}; give a whole number of local steps >= 1 between outer steps")
    if isinstance(accum, bool) or not isinstance(accum, int) or accum < 1:
        raise ConfigError(f"accum={accum!r}; give a whole number of micro-batches >= 1")
    return StrategyOptions(accum=accum, **given)


def make(name, problem, optimizer, mesh, opts: StrategyOptions, return_grads=True) -> Strategy:
    return FACTORIES[resolve(name)](problem, optimizer, mesh, opts, return_grads=return_grads)


__all__ = ["FACTORIES", "HOST_FULL", "ONE_DEVICE", "OPTIONS", "REDUCTION_OPTIONS", "STATS_INPUTS", "Strategy",
           "StrategyOptions", "TrainState", "host_full", "make", "options", "resolve", "stats_inputs"]
