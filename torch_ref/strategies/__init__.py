"""The torch strategies, one small module each, with the JAX side's names (`jaxdp.strategies`).

Each module's `make(model, optimizer, opts)` wraps `model` (on its device, parameters loaded),
builds the optimizer from the user's factory and returns a `common.Strategy` (with its own part of
the canonical step, `canonical_parts`); `torch_ref.parallelize` is the public door (`torch_ref/api.py`).
"""
from __future__ import annotations

from jaxdp.core.registry import strategies as registry
from jaxdp.core.run.config import ALIASES, FRAMEWORK_STRATEGIES, ConfigError

from ..canonical.step import Canonical
from .common import Strategy, StrategyOptions

FACTORIES = registry.factories("torch")  # one row per strategy: jaxdp/core/registry/strategies.py
# jaxdp's -jit strategies (plain jax.jit over NamedShardings) have no torch form of their own: torch_ref runs,
# under the same name, the strategy with the same layout, and says so (`twin_note`; the run's meta `torch_twin`).
TWINS = {e.name: e.twin for e in registry.ENTRIES if e.twin}
TWIN_TOOLS = {e.twin: e.twin_tool for e in registry.ENTRIES if e.twin}
assert tuple(FACTORIES) + tuple(TWINS) == FRAMEWORK_STRATEGIES["torch"]
# The options each strategy takes (besides accum), as `parallelize(..., **options)` names them.
OPTIONS = {name: registry.entry(name).torch_options for name in FACTORIES}

def resolve(name: str) -> str:
    """`name` with aliases resolved (fsdp -> zero3) and a -jit name to its twin (`TWINS`); an unknown name is
    an error listing the valid ones."""
    name = TWINS.get(ALIASES.get(name, name), ALIASES.get(name, name))
    if name not in FACTORIES:
        raise ConfigError(f"unknown strategy {name!r}; valid: {', '.join(FACTORIES)} (or "
                          f"{', '.join((*ALIASES, *TWINS))})")
    return name


def twin_note(name: str) -> str | None:
    """What torch_ref runs for a -jit name (None for the others), in one line for the run's summary."""
    if name not in TWINS:
        return None
    return f"{name}: torch_ref runs its same-layout twin {TWINS[name]} ({TWIN_TOOLS[TWINS[name]]})"


def build(name: str, model, optimizer, accum: int = 1, reduction: str = "native", shards: int | None = None,
          mp_policy=None, **options) -> Strategy:
    """Wrap `model` for strategy `name` with the optimizer factory `optimizer`; every rank calls it.
    `reduction="canonical"`: the strategy's step is the canonical one (`canonical.step.Canonical`); `mp_policy`:
    FSDP2's MixedPrecisionPolicy (zero3, hsdp: torch_ref/kernels.py)."""
    name = resolve(name)
    unknown = sorted(set(options) - set(OPTIONS[name]))
    if unknown:
        takes = ", ".join(OPTIONS[name]) or "none"
        raise ConfigError(f"strategy {name!r} takes no option {', '.join(map(repr, unknown))}; its options: {takes}")
    par = FACTORIES[name](model, optimizer, StrategyOptions(accum=accum, reduction=reduction, shards=shards,
                                                                mp_policy=mp_policy, **options))
    if reduction == "canonical":
        par.canonical = Canonical(par, shards)
    return par


def options_of(cfg) -> dict:
    """The strategy options of a RunConfig (`--bucket-mb`, `--reshard-after-forward`, `--replicas`)."""
    values = {"bucket_mb": cfg.bucket_mb, "reshard_after_forward": cfg.reshard_after_forward, "replicas": cfg.replicas,
              "hsdp_hosts": cfg.hsdp_hosts, "inner_steps": cfg.inner_steps, "outer_lr": cfg.outer_lr,
              "outer_momentum": cfg.outer_momentum}
    return {k: values[k] for k in OPTIONS[resolve(cfg.strategy)] if k in values}


__all__ = ["FACTORIES", "OPTIONS", "TWINS", "Strategy", "StrategyOptions", "build", "options_of", "resolve",
           "twin_note"]
