"""`python -m torch_ref train`'s run: the torch side trained from the JAX side's initial parameters (the
one source of the initial bits), so that its trace and `jaxdp train`'s can be compared bit for bit.
It lives in the harness because it needs both frameworks; `torch_ref.train.run` is the torch-only part."""
from __future__ import annotations

from .. import models
from ..core.run import data
from ..core.run.config import RunConfig


def initial_arrays(cfg: RunConfig) -> dict:
    """`cfg`'s initial parameters as Flax-named arrays (checked first: a bad configuration is one line)."""
    cfg.validate("torch")
    return models.initial_arrays(cfg, data.load(cfg.data, cfg.seed, cfg.seq_len))


def run(cfg: RunConfig, trace_path=None, record: bool | None = None, timeout_s: float = 3600.0,
        pg_timeout_s: float = 300.0, heartbeat_s: float = 60.0):
    """`torch_ref.train.run` from JAX's initial parameters: rank 0's `RunResult` (None on other ranks)."""
    from torch_ref import train

    return train.run(cfg, trace_path, record, timeout_s, pg_timeout_s, init=initial_arrays(cfg),
                     heartbeat_s=heartbeat_s)
