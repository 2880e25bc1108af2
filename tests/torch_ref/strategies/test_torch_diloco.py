"""diloco in torch_ref against its two oracles and against jaxdp, in float64 to 1e-12 relative (as
tests/jaxdp/strategies/test_diloco.py, whose configurations and simulation these reuse), on one world of 2 ranks:
- K = 1 with outer SGD at lr 1, no momentum, and inner SGD is torch's ddp (DistributedDataParallel);
- in general, the one-process simulation (`jaxdp.strategies.diloco_reference.simulate`), step by step;
- jaxdp's diloco on the same configuration (the cross-framework pair).
Each is shown to fail: outer lr 0.9 against ddp, and the outer momentum dropped against the simulation.
"""
from __future__ import annotations

import functools

import pytest

from tests.jaxdp.strategies.test_diloco import AS_DDP, GENERAL, TOL, simulated, steps_of, worst

AS_DDP_TORCH = AS_DDP.replace(strategy="ddp", inner_steps=4, outer_lr=0.7, outer_momentum=0.9)
WRONG_LR = AS_DDP.replace(outer_lr=0.9)
NO_MOMENTUM = GENERAL.replace(outer_momentum=0.0)
JOBS = (AS_DDP, AS_DDP_TORCH, WRONG_LR, GENERAL, NO_MOMENTUM)


@functools.cache
def torch_runs() -> dict:
    """Every configuration of JOBS trained by torch_ref on one spawned world of 2 ranks: {cfg: its trace arrays}."""
    from tests.torch_helpers import init_for, init_key, train_jobs
    from torch_ref.launch import launch

    jobs = [(cfg, init_for(init_key(cfg)), True) for cfg in JOBS]
    results = launch(train_jobs, 2, jobs, timeout_s=600, pg_timeout_s=120)[0]
    return {cfg: steps_of(r.arrays) for cfg, r in zip(JOBS, results, strict=True)}


@pytest.mark.parametrize("cfg,ref,broken", [(AS_DDP, AS_DDP_TORCH, False), (WRONG_LR, AS_DDP_TORCH, True)],
                         ids=["k1-lr1-sgd", "outer-lr-0.9"])
def test_torch_k1_outer_sgd_lr1_inner_sgd_equals_ddp(cfg, ref, broken):
    error, key = worst(torch_runs()[cfg], torch_runs()[ref])
    assert (error > 1e-4) if broken else (error < TOL), (key, error)


@pytest.mark.parametrize("cfg,broken", [(GENERAL, False), (NO_MOMENTUM, True)], ids=["general", "no-momentum"])
def test_torch_diloco_equals_the_one_process_simulation_step_by_step(cfg, broken):
    got, ref = torch_runs()[cfg], simulated(GENERAL)  # NO_MOMENTUM stands for a diloco that drops the momentum
    assert sorted(got) == sorted(ref)
    error, key = worst(got, ref)
    assert (error > 1e-4) if broken else (error < TOL), (key, error)


def test_torch_diloco_equals_jaxdp_diloco():
    from tests.conftest import run

    error, key = worst(torch_runs()[GENERAL], steps_of(run(GENERAL).arrays))
    assert error < TOL, (key, error)
