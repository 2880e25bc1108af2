"""The memory table's gradient bytes per device (`accounting.memory`, `jaxdp memory`, the bench's items 4-5) come
from the shardings the lowered step declares for its outputs (`accounting.declared_bytes_on`), not from compiling
and running a second program. Here, for every strategy on a small mlp at N = 4 and on the cnn with sync
BatchNorm where a strategy takes it, the declared bytes equal those of the compiled step's run (`bytes_on`), and
differ from the unsharded gradient's wherever the strategy shards it (so a declaration that dropped the
sharding would be caught)."""
from __future__ import annotations

import math

import jax
import pytest

from jaxdp.analysis import accounting
from jaxdp.core.registry import strategies as registry
from jaxdp.core.run.config import RunConfig
from jaxdp.strategies import FACTORIES

MLP = RunConfig(model="mlp", data="synthetic", hidden=(64, 64), batch_size=32, devices=4, optimizer="adamw")
CNN = RunConfig(model="cnn", data="digits", channels=(4, 8), batchnorm="sync", batch_size=32, devices=4,
                optimizer="adamw")
SHARDED = {"zero2", "zero3", "hsdp", "fsdp-jit", "zero1-jit explicit"}  # a gradient sharded over the devices
CASES = [(s, MLP) for s in sorted(FACTORIES) if s != "single" and registry.get(s, "oracle") == "single"]
CASES += [(s, CNN) for s in ("ddp", "ddp-pmap", "zero2", "zero3")]
CASES += [(s, MLP.replace(axis_type="explicit")) for s in ("ddp-jit", "zero1-jit", "fsdp-jit")]


@pytest.mark.parametrize("strategy, base", CASES, ids=lambda v: v if isinstance(v, str) else v.model)
def test_declared_gradient_bytes_are_the_runs(strategy, base):
    cfg = base.replace(strategy=strategy).validate("jax")
    lowered = accounting.compile_step(cfg, return_grads=True, lower_only=True)
    grads = lowered.program.out_info[1]["grads"]
    declared = accounting.declared_bytes_on(grads, lowered.devices[0])
    c = accounting.compile_step(cfg, return_grads=True)
    _, metrics = c.program(c.state, *c.batch)
    assert declared == accounting.bytes_on(metrics["grads"], c.devices[0])
    full = sum(math.prod(p.shape) * p.dtype.itemsize for p in jax.tree.leaves(lowered.problem.params))
    sharded = strategy in SHARDED or f"{strategy} {cfg.axis_type}" in SHARDED
    assert (declared < full) == sharded, (declared, full)
