"""`jaxdp.devices.request_fixed_threads` (reduction="canonical"): XLA:CPU's intra-op pool given one size in every
process, before JAX starts; a value already set is kept; nothing once JAX has started. The bits it protects are
checked across fresh processes in tests/jaxdp/canonical/test_device_count.py."""
from __future__ import annotations

import os

import pytest
from jax._src import xla_bridge

from jaxdp import devices


@pytest.mark.parametrize("started, preset, expected", [
    (False, None, str(max(os.cpu_count() or 1, devices.CANONICAL_THREADS))),
    (False, "3", "3"),  # the user's own size, kept
    (True, None, None),  # JAX started: the pool exists, nothing to set
])
def test_request_fixed_threads(monkeypatch, started, preset, expected):
    monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: started)
    monkeypatch.delenv(devices.THREADS_ENV, raising=False)
    if preset is not None:
        monkeypatch.setenv(devices.THREADS_ENV, preset)
    devices.request_fixed_threads()
    assert os.environ.get(devices.THREADS_ENV) == expected
