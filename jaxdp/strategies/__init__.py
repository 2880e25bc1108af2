"""The strategies, one small module each, all with the same interface (`common.Strategy`)."""
from __future__ import annotations

from ..config import FRAMEWORK_STRATEGIES, ConfigError
from . import bucket, ddp, ddp_pmap, dp, ring, single, zero
from .common import Strategy, TrainState

FACTORIES = {
    "single": single.make,
    "dp": dp.make,
    "ddp": ddp.make,
    "ddp-pmap": ddp_pmap.make,
    "ddp-bucket": bucket.make,
    "ddp-ring": ring.make,
    "zero1": zero.make_stage(1),
    "zero2": zero.make_stage(2),
    "zero3": zero.make_stage(3),
}
assert tuple(FACTORIES) == FRAMEWORK_STRATEGIES["jax"]


def make(name, problem, optimizer, mesh, cfg, return_grads=True) -> Strategy:
    if name not in FACTORIES:
        raise ConfigError(f"unknown strategy {name!r}; valid: {', '.join(FACTORIES)}")
    return FACTORIES[name](problem, optimizer, mesh, cfg, return_grads=return_grads)


__all__ = ["FACTORIES", "Strategy", "TrainState", "make"]
