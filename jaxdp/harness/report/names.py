"""The strategies `jaxdp compare` can run: those both frameworks have, checked before anything heavy is imported
(no JAX, no torch: `jaxdp compare` answers a bad name, or says it has started, within its first seconds)."""
from __future__ import annotations

from ...core.run.config import FRAMEWORK_STRATEGIES, PACKAGE, ConfigError


def check_strategies(names) -> None:
    """Every strategy must exist in both frameworks; otherwise say which side lacks it."""
    for name in names:
        missing = [PACKAGE[f] for f, known in FRAMEWORK_STRATEGIES.items() if name not in known]
        if len(missing) == 2:
            raise ConfigError(
                f"unknown strategy {name!r}; valid in both frameworks: "
                f"{', '.join(s for s in FRAMEWORK_STRATEGIES['jax'] if s in FRAMEWORK_STRATEGIES['torch'])}"
            )
        if missing:
            raise ConfigError(
                f"strategy {name!r} is missing in {missing[0]}: compare needs it in both frameworks "
                f"(compare ddp-pmap / ddp-naive with `jaxdp parity`, which pairs them with ddp)"
            )
