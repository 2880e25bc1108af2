"""Shared set-up: 8 simulated CPU devices and float64 for the whole session (both must be set before
JAX initialises), and a session cache of runs so each configuration trains once."""
from __future__ import annotations

import functools
import os

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: see torch_ref/__init__.py
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # a GPU: JAX shares it with torch (test_gpu.py)

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_enable_x64", True)

from jaxdp import train  # noqa: E402
from jaxdp.core.config import RunConfig  # noqa: E402

from . import torch_jobs  # noqa: E402
from .torch_jobs import pytest_runtest_call  # noqa: E402, F401 (the hook: the running test's torch jobs)

# A small problem on which every strategy, N in {1,2,3,4,8} and accum in {1,3} divide the batch.
BASE = RunConfig(model="mlp", data="synthetic", hidden=(16, 16), steps=4, batch_size=72, lr=0.05,
                 weight_decay=0.01, dtype="float64", seed=3)


@functools.cache
def run(cfg: RunConfig) -> train.RunResult:
    """Train `cfg` once per session, recording the trace arrays."""
    return train.run(cfg, record=True, progress=False)


@pytest.hookimpl(trylast=True)  # after -k, -m and --deselect have removed what will not run
def pytest_collection_modifyitems(items):
    """The torch worlds run the jobs of the selected tests only (tests/torch_jobs.py)."""
    torch_jobs.select(items)
