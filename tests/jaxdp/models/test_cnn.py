"""`--model cnn`: BatchNorm under data parallelism, in both frameworks, float64, to 1e-12.

- `sync` statistics: every strategy equals its own framework's `single` (micro-batch j holds the
  same rows on every strategy and N: `jaxdp.core.run.data.micro_major`), and jaxdp equals torch_ref;
- `local` statistics: not `single` (shown), but every strategy of one N and accum equals every other,
  and jaxdp equals torch_ref (running statistics rank 0's, as torch DDP's broadcast_buffers=True);
- the running statistics are in the trace (`state/...`, `step/<k>/state/...`) and move.
Cases: pairwise over strategies x N in {1,2,3,4} x accum {1,3} x batchnorm (32); torch's run in the
suite's shared worlds (tests/torch_helpers.py `CNN_CASES`; JAX's ddp-pmap is torch's ddp-naive).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from jaxdp.core.run.config import ConfigError
from jaxdp.core.traces import trace
from tests.conftest import run
from tests.helpers import as_trace
from tests.torch_helpers import CNN_CASES, CNN_DIMENSIONS, cnn_torch, result, single

TOL = 1e-12


def case_id(cfg):
    return f"{cfg.strategy}-x{cfg.devices}-acc{cfg.accum}-{cfg.batchnorm}"


def worst(a, b, check_config=True):
    """{array: relative error} above TOL of trace `a` against `b`, worst first."""
    per = trace.diff(a, b, check_config=check_config)["per_array"]
    return sorted(((k, v) for k, v in per.items() if v > TOL), key=lambda kv: -kv[1])[:5]


def jax_case(cfg):
    return as_trace(run(cfg))


def torch_case(cfg):
    """The torch run of a case, in the shared worlds (ddp-pmap, JAX-only, is torch's ddp-naive there)."""
    return as_trace(result(cnn_torch(cfg)))


def test_cases_cover_every_pair():
    for a, b in itertools.combinations(CNN_DIMENSIONS, 2):
        met = {(getattr(c, a), getattr(c, b)) for c in CNN_CASES}
        assert met == set(itertools.product(CNN_DIMENSIONS[a], CNN_DIMENSIONS[b])), (a, b)


@pytest.mark.torch_jobs(lambda p: [cnn_torch(p["cfg"])])
@pytest.mark.parametrize("cfg", CNN_CASES, ids=case_id)
def test_jax_equals_torch(cfg):
    """Cross-framework parity, both modes: loss, gradients, parameters, running statistics."""
    assert not worst(jax_case(cfg), torch_case(cfg)), case_id(cfg)


@pytest.mark.torch_jobs(lambda p: [cnn_torch(p["cfg"])])
@pytest.mark.parametrize("cfg", [c for c in CNN_CASES if c.batchnorm == "sync"], ids=case_id)
def test_sync_equals_single(cfg):
    """Each framework against its own single (same accum: the same micro-batches)."""
    ref = cfg.replace(strategy="single", devices=1)
    assert not worst(jax_case(cfg), as_trace(run(ref))), f"jax {case_id(cfg)}"
    assert not worst(torch_case(cfg), as_trace(single(ref))), f"torch {case_id(cfg)}"


@pytest.mark.torch_jobs(*[cnn_torch(c) for c in CNN_CASES if c.batchnorm == "local"])
def test_local_strategies_agree_per_devices_and_accum():
    """Under `local`, every strategy of one (N, accum) computes the same thing (in each framework)."""
    groups: dict = {}
    for cfg in (c for c in CNN_CASES if c.batchnorm == "local"):
        groups.setdefault((cfg.devices, cfg.accum), []).append(cfg)
    compared = 0
    for cases in groups.values():
        for cfg in cases[1:]:
            assert not worst(jax_case(cfg), jax_case(cases[0])), f"jax {case_id(cfg)} vs {case_id(cases[0])}"
            assert not worst(torch_case(cfg), torch_case(cases[0])), f"torch {case_id(cfg)}"
            compared += 1
    assert compared >= 4


def test_local_differs_from_single_by_design():
    """N > 1 devices' own statistics are not the global batch's: O(1e-3) or more, not rounding."""
    cfg = next(c for c in CNN_CASES if c.batchnorm == "local" and c.devices > 1)
    ref = as_trace(run(cfg.replace(strategy="single", devices=1, batchnorm="sync")))
    diff = trace.diff(jax_case(cfg), ref, check_config=False)
    assert diff["worst"]["grad"] > 1e-4 and diff["worst"]["state"] > 1e-4, diff["worst"]
    one = next(c for c in CNN_CASES if c.batchnorm == "local" and c.devices == 1)  # N = 1: local is single
    assert not worst(jax_case(one), as_trace(run(one.replace(strategy="single", batchnorm="sync"))),
                     check_config=False)


@pytest.mark.torch_jobs(cnn_torch(CNN_CASES[0]))
def test_trace_records_running_statistics():
    arrays = run(CNN_CASES[0]).arrays
    assert {"state/bn1/mean", "state/bn1/var", "state/bn2/mean", "state/bn2/var"} <= set(arrays)
    assert np.array_equal(arrays["state/bn1/var"], np.ones_like(arrays["state/bn1/var"]))
    moved = arrays["step/1/state/bn1/mean"]
    assert np.abs(moved).max() > 0 and not np.array_equal(moved, arrays["step/2/state/bn1/mean"])
    assert set(torch_case(CNN_CASES[0]).arrays) == set(arrays)


def test_a_wrong_running_statistic_is_caught():
    """The harness can fail on state: a running variance off by 1e-9 relative."""
    good = as_trace(run(CNN_CASES[0]))
    arrays = dict(good.arrays)
    arrays["step/2/state/bn2/var"] = arrays["step/2/state/bn2/var"] * (1 + 1e-9)
    assert worst(trace.Trace(good.meta, arrays), good)[0][0] == "step/2/state/bn2/var"


@pytest.mark.parametrize("changes, message", [
    (dict(data="synthetic"), "model 'cnn' trains on 8x8 images: use --data digits"),
    (dict(channels=(8, 8, 8)), "--channels takes two widths (conv1,conv2), got 3"),
    (dict(batchnorm="global"), "unknown batchnorm 'global'; valid: sync, local"),
])
def test_bad_cnn_config_is_one_line(changes, message):
    with pytest.raises(ConfigError) as e:
        CNN_CASES[0].replace(**changes).validate()
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
