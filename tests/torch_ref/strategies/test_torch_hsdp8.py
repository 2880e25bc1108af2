"""torch_ref hsdp on 8 ranks: R x S = 4x2 and 2x4 (float64, accumulation 3, clipping 0.5, AdamW, 2 steps)
equal torch `single` to 1e-12 (the tolerance argued in test_torch_strategies.py), and the 2x4 run equals
jaxdp's hsdp 2x4 (8 simulated devices, in process). The grids of N = 4 are in test_torch_strategies.py;
tests/torch_helpers.py's worlds stop at 4, so one world of 8 ranks, spawned here once, runs both grids.
The check is shown to fail on a trace with one step's gradients off by 1e-3. The same world runs both
grids with `--reduction canonical`: bitwise single's.
"""
from __future__ import annotations

import functools

import pytest

from jaxdp.core.traces import trace
from jaxdp.core.traces.spread import is_spread
from tests.helpers import as_trace, assert_judged_ok, judged, with_grads
from tests.torch_helpers import BASE, init_for, init_key, single

TOL = 1e-12
# (R, S) x reshard-after-forward: the two grids of 8, one each way
GRIDS = [BASE.replace(strategy="hsdp", devices=8, replicas=r, accum=3, clip_norm=0.5, optimizer="adamw", steps=2,
                      reshard_after_forward=k) for r, k in ((4, False), (2, True))]


def case_id(cfg):
    return f"{cfg.replicas}x{cfg.devices // cfg.replicas}-reshard{cfg.reshard_after_forward}"


# `--reduction canonical` at both grids of 8 (tests/torch_canonical_ranks.py's float32 mlp, 8 shards): bitwise single
CANONICAL = [("hsdp:4", 8, 3, "adamw", 0.5, "canonical", 8), ("hsdp:2", 8, 1, "momentum", 0.0, "canonical", 8)]


def train_grids(rank: int, n: int, cfgs: list, init: dict) -> tuple[list, dict]:
    """In each of the 8 spawned ranks: train every grid, recording; then the canonical cases."""
    from tests import torch_canonical_ranks
    from torch_ref.train import train_rank

    native = [train_rank(rank, n, cfg, init, record=True) for cfg in cfgs]
    return native, {case: torch_canonical_ranks.train_case(rank, n, case) for case in CANONICAL}


@functools.cache
def world8() -> dict:
    """Both grids' rank-0 results, {cfg: RunResult}, from one spawned world of 8 ranks (the launcher
    gives each rank max(1, cores // 8) = 1 intra-op thread)."""
    from torch_ref.launch import launch

    native, canonical = launch(train_grids, 8, GRIDS, init_for(init_key(BASE)), timeout_s=300, pg_timeout_s=120)[0]
    return {**dict(zip(GRIDS, native, strict=True)), **canonical}


def single_of(cfg):
    return single(cfg.replace(replicas=1, reshard_after_forward=True))


def worst_off(got: trace.Trace, ref: trace.Trace, check_config=True) -> dict:
    """The arrays of `got` more than TOL (relative to the largest |ref|) from `ref`'s, worst first."""
    per_array = trace.diff(got, ref, check_config=check_config)["per_array"]
    return dict(sorted(((k, v) for k, v in per_array.items() if v > TOL), key=lambda kv: -kv[1]))


@pytest.mark.parametrize("cfg", GRIDS, ids=case_id)
def test_hsdp_of_8_equals_single(cfg):
    got, ref = world8()[cfg], single_of(cfg)
    assert got.meta["strategy"] == "hsdp" and got.meta["replicas"] == cfg.replicas
    assert not worst_off(as_trace(got), as_trace(ref)), list(worst_off(as_trace(got), as_trace(ref)).items())[:5]
    assert_judged_ok(got, ref)


def test_hsdp_2x4_equals_jaxdp_hsdp_2x4():
    from tests.conftest import run

    got, ref = world8()[GRIDS[1]], run(GRIDS[1])
    assert not worst_off(as_trace(got), as_trace(ref), check_config=False)
    assert_judged_ok(got, ref, sides=("torch", "jax"), check_config=False)


def test_a_gradient_off_by_1e_3_fails_the_check():
    """One step's gradients of the honest 2x4 trace scaled by 1.001: both checks fail on that step."""
    honest, ref = as_trace(world8()[GRIDS[1]]), as_trace(single_of(GRIDS[1]))
    broken = with_grads(honest, 1, 1.001)
    off = worst_off(broken, ref)
    assert off and all(k.startswith("step/1/grad/") for k in off), off
    assert max(off.values()) == pytest.approx(1e-3, rel=1e-6)
    assert not judged(broken, ref).ok


@pytest.mark.parametrize("case", CANONICAL, ids=lambda c: f"{c[0]}-accum{c[2]}-{c[3]}-clip{c[4]}")
def test_hsdp_of_8_canonical_is_single_bit_for_bit(case):
    """4x2 and 2x4 with `--reduction canonical`: every array bitwise `single`'s (8 shards), as at N = 4
    (test_torch_canonical.py, which also shows the bitwise check failing on native hsdp)."""
    import numpy as np

    from tests import torch_canonical_ranks

    got = world8()[case]
    ref = torch_canonical_ranks.train_case(0, 1, ("single", 1, *case[2:]))
    got = {k: v for k, v in got.items() if not is_spread(k)}
    assert got.keys() == ref.keys() and len(ref) > 10
    assert [k for k in ref if not np.array_equal(ref[k], got[k])] == []
