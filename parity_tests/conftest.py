"""The parity suite's shared set-up: 8 simulated JAX CPU devices and float64 (set before JAX starts),
and session caches so that each configuration trains once per framework: JAX in this process,
torch in one spawned world per device count running all of the suite's torch configurations."""
from __future__ import annotations

import functools
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: see torch_ref/__init__.py

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_enable_x64", True)

from jaxdp.core.traces import trace  # noqa: E402
from jaxdp.harness import pair_runs  # noqa: E402
from jaxdp.judge import parity  # noqa: E402

from .cases import ALL, sides  # noqa: E402


@functools.cache
def jax_run(cfg):
    return pair_runs.run_jax(cfg)


@functools.cache
def torch_runs() -> dict:
    return pair_runs.run_torch(list(dict.fromkeys(sides(label, cfg)[1] for label, cfg in ALL)))


def compare(label, cfg) -> parity.Row:
    jcfg, tcfg = sides(label, cfg)
    j, t = jax_run(jcfg), torch_runs()[tcfg]
    return parity.compare(trace.Trace(j.meta, j.arrays), trace.Trace(t.meta, t.arrays), jcfg, label)
