"""`jaxdp bench`'s plan (jaxdp/harness/bench/plan.py): every run of the full plan and of --quick passes
the CLI's validation (`RunConfig.validate`, no compile, milliseconds), so a planned run the CLI would
refuse fails here, not after minutes of benchmarking (the full bench once died after 313 s on a -jit
strategy planned against the cnn, which runs BatchNorm)."""
from __future__ import annotations

import dataclasses

import pytest

from jaxdp.core.run.config import ConfigError
from jaxdp.harness.bench.plan import every_config, plan, time_runs


@pytest.mark.parametrize("quick", [False, True])
def test_every_planned_run_passes_the_cli_validation(quick):
    p = plan(quick)
    runs = list(every_config(p))
    assert {item for item, *_ in runs} == {"time", "comm", "reduction", "jit", "fused"}
    refused = []
    for item, framework, cfg in runs:
        try:
            cfg.validate(framework)
        except ConfigError as err:
            refused.append(f"{item} ({framework}): {cfg.model} {cfg.strategy} N={cfg.devices}: {err}")
    assert refused == []


def test_a_refused_run_in_the_plan_fails_the_check():
    """The check can fail: the old plan (every timed strategy on every model, -jit on the cnn), and item 9
    at an N that does not divide the default S."""
    p = plan(False)
    old = [c.replace(strategy=s) for _, n, cfgs in time_runs(p) if n > 1 for c in cfgs[:1]
           for s in p.time_strategies if s != "single"]
    with pytest.raises(ConfigError, match="runs no model with running statistics"):
        for cfg in old:
            cfg.validate("jax")
    wide = dataclasses.replace(p, reduction_ns=(8,))
    with pytest.raises(ConfigError, match="needs n to divide shards"):
        for _, _, cfg in every_config(wide):
            cfg.validate("jax")
