"""The torch strategies, one small module each, with the JAX side's names (`jaxdp.strategies`)."""
from __future__ import annotations

from jaxdp.config import FRAMEWORK_STRATEGIES, ConfigError

from . import bucket, ddp, dp, naive, ring, single, zero1, zero2, zero3
from .common import Strategy

FACTORIES = {
    "single": single.make,
    "dp": dp.make,
    "ddp": ddp.make,
    "ddp-naive": naive.make,
    "ddp-bucket": bucket.make,
    "ddp-ring": ring.make,
    "zero1": zero1.make,
    "zero2": zero2.make,
    "zero3": zero3.make,
}
assert tuple(FACTORIES) == FRAMEWORK_STRATEGIES["torch"]


def make(name, model, cfg, return_grads: bool = False) -> Strategy:
    """Wrap `model` (on its device, parameters loaded) for strategy `name`; every rank calls it."""
    if name not in FACTORIES:
        raise ConfigError(f"unknown strategy {name!r}; valid: {', '.join(FACTORIES)}")
    return FACTORIES[name](model, cfg, return_grads)


__all__ = ["FACTORIES", "Strategy", "make"]
