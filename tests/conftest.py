"""Shared set-up: 8 simulated CPU devices and float64 for the whole session (both must be set before
JAX initialises), and a session cache of runs so each configuration trains once."""
from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: see torch_ref/__init__.py
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # a GPU: JAX shares it with torch (test_gpu.py)
# --target's compiled programs (analysis/program_cache.py): the session's own folder, not the user's cache,
# removed when the session ends
if "JAXDP_PROJECTION_CACHE" not in os.environ:
    os.environ["JAXDP_PROJECTION_CACHE"] = tempfile.mkdtemp(prefix="jaxdp-projection-")
    atexit.register(shutil.rmtree, os.environ["JAXDP_PROJECTION_CACHE"], ignore_errors=True)

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_enable_x64", True)

from jaxdp import train  # noqa: E402
from jaxdp.core.run.config import RunConfig  # noqa: E402

from . import quick, results, torch_jobs, touched  # noqa: E402

# A small problem on which every strategy, N in {1,2,3,4,8} and accum in {1,3} divide the batch.
BASE = RunConfig(model="mlp", data="synthetic", hidden=(16, 16), steps=4, batch_size=72, lr=0.05,
                 weight_decay=0.01, dtype="float64", seed=3)


@functools.cache
def run(cfg: RunConfig) -> train.RunResult:
    """Train `cfg` once per session, recording the trace arrays."""
    return train.run(cfg, record=True, progress=False)


def pytest_configure(config):
    """The suite's plugins: the quick tier's marker (tests/quick.py) and its check that every module was
    touched (tests/touched.py); the torch worlds' jobs of the selected tests (tests/torch_jobs.py); the suite's
    figures for the docs when asked (tests/results.py)."""
    for plugin in (quick, results, torch_jobs, touched):
        if not config.pluginmanager.is_registered(plugin):
            config.pluginmanager.register(plugin)
