"""torch_ref's profiler: kineto's `USDT: ... profiler_start/stop` lines (printed on fd 2 at every start and
stop) are dropped; every other line written to stderr while profiling still reaches it."""
from __future__ import annotations

import os

import numpy as np
import torch

from jaxdp.core.run import data
from tests.torch_helpers import BASE
from torch_ref import models, train
from torch_ref.analysis import accounting, profiler


def _profiled_single_step(tmp_path):
    """One `single` step of a small mlp under `accounting._profiled_step` (the compare report's measurement),
    in a gloo world of one (its collective count asks the world's size), taken down after."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        return _step()
    finally:
        dist.destroy_process_group()


def _step():
    cfg = BASE.replace(strategy="single", devices=1)
    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    strategy = train.strategy(models.build(cfg, dataset), cfg)
    x, y = dataset.batch(1, cfg.batch_size)
    events, seconds, peak = accounting._profiled_step(strategy, torch.from_numpy(x), torch.from_numpy(
        y.astype(np.int64)), torch.device("cpu"), at_start=0)
    return seconds, peak


def test_a_profiled_step_prints_no_kineto_markers(capfd, tmp_path):
    seconds, peak = _profiled_single_step(tmp_path)
    assert seconds > 0 and peak > 0
    err = capfd.readouterr().err
    assert "USDT" not in err and "profiler_start" not in err, err


def test_the_filter_drops_the_markers_and_keeps_everything_else(capfd):
    """torch.profiler alone prints the markers (on this torch; skipped where it does not); inside
    `quiet_markers`, a line of any other kind written to fd 2 (an error, say) still comes out."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]):
        torch.ones(3) @ torch.ones(3)
    raw = capfd.readouterr().err
    with profiler.profile(activities=[ProfilerActivity.CPU]):
        os.write(2, b"ERROR: a real error, kept\n")
        torch.ones(3) @ torch.ones(3)
    err = capfd.readouterr().err
    assert err == "ERROR: a real error, kept\n"
    if "profiler_start" in raw:  # the check above would have seen them: torch prints them here
        assert profiler.drop_markers(raw.encode()) == b""
    line = b"USDT:2026-11-25 15:06:53 31973:31973 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
    assert profiler.drop_markers(line + b"USDT: something else\n") == b"USDT: something else\n"
