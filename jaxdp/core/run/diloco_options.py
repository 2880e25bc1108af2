"""diloco's options (`--inner-steps`, `--outer-lr`, `--outer-momentum`: jaxdp/strategies/diloco.py) and what a run
of diloco refuses, checked by `RunConfig.validate` for the command line and the library alike."""
from __future__ import annotations

from ..errors import ConfigError

# the flags' defaults: K small enough for the project's short runs (the paper's is 500), the paper's outer SGD
DEFAULTS = {"inner_steps": 4, "outer_lr": 0.7, "outer_momentum": 0.9}


def check(cfg) -> None:
    """diloco's flags only on diloco; diloco runs no BatchNorm model, no canonical reduction, no checkpoint."""
    for name, default in DEFAULTS.items():
        if getattr(cfg, name) != default and cfg.strategy != "diloco":
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} {getattr(cfg, name)} is for --strategy diloco, not {cfg.strategy}: "
                              f"drop {flag}")
    if cfg.strategy != "diloco":
        return
    if cfg.model == "cnn":
        raise ConfigError("--strategy diloco has no --model cnn (BatchNorm's running statistics would differ per "
                          "replica): use ddp")
    if cfg.reduction != "native":
        raise ConfigError("--strategy diloco has --reduction native only: drop --reduction canonical")
    if cfg.checkpoint_every or cfg.resume:
        raise ConfigError("--strategy diloco does not checkpoint (its state is per replica): drop "
                          "--checkpoint-every and --resume")
