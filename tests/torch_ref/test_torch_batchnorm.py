"""torch_ref/batchnorm.py for users' models: `convert_sync_batchnorm` (what it carries over, what it refuses),
the converted layers against torch's own in a world of one, and a user's conv net (nn.BatchNorm2d and
nn.BatchNorm1d) at N=2 in the suite's shared world (tests/torch_bn_ranks.py): converted, every strategy equals
`single` (float64, the judge's 1e-12) with a rank spread of exactly 0; plain, under ddp and zero3 the ranks'
running statistics spread and the judge says so; a parameter perturbed on one rank is caught by its spread."""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_ref
from jaxdp.core.traces import trace
from jaxdp.core.traces.spread import is_spread
from jaxdp.harness import cli_diff
from jaxdp.judge import divergence, parity
from tests import torch_bn_ranks as R
from tests.torch_helpers import world, world_of_one
from torch_ref import batchnorm
from torch_ref.trace import Recorder


# ---- convert_sync_batchnorm, in this process ------------------------------------------------------------
def test_convert_carries_every_setting_and_the_same_tensors():
    bn = nn.BatchNorm3d(3, eps=1e-3, momentum=None).double()
    bn.weight.requires_grad_(False)
    bn.eval()
    net = nn.Sequential(nn.Conv3d(1, 3, 1), nn.Sequential(bn), nn.BatchNorm1d(4, affine=False,
                                                                             track_running_stats=False))
    tensors = [bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.num_batches_tracked]
    assert batchnorm.convert_sync_batchnorm(net) is net
    new, flat = net[1][0], net[2]
    assert type(new) is batchnorm.BatchNorm3d and isinstance(new, nn.BatchNorm3d) and new.sync and not new.training
    assert [new.weight, new.bias, new.running_mean, new.running_var, new.num_batches_tracked] == tensors
    assert all(a is b for a, b in zip([new.weight, new.bias, new.running_mean, new.running_var,
                                       new.num_batches_tracked], tensors, strict=True))
    assert (new.eps, new.momentum, new.weight.requires_grad, new.weight.dtype) == (1e-3, None, False, torch.float64)
    assert type(flat) is batchnorm.BatchNorm1d and flat.weight is None and flat.running_mean is None
    root = nn.SyncBatchNorm(2)
    converted = batchnorm.convert_sync_batchnorm(root)
    assert type(converted) is batchnorm.SyncBatchNorm and converted.weight is root.weight


@pytest.mark.parametrize("source, shape", [(lambda: nn.BatchNorm1d(3), (5, 3)), (lambda: nn.BatchNorm1d(3), (5, 3, 4)),
                                           (lambda: nn.BatchNorm2d(3, momentum=None), (5, 3, 2, 2)),
                                           (lambda: nn.BatchNorm3d(3), (5, 3, 2, 1, 2)),
                                           (lambda: nn.SyncBatchNorm(3), (5, 3, 2))])
def test_a_converted_layer_is_torchs_in_a_world_of_one(source, shape):
    """Without other ranks the converted layer is torch's (training and eval); its sync arithmetic, called
    directly in a process group of one, equals torch's kernel to roundoff on every input rank."""
    torch.manual_seed(0)
    twin = batchnorm.convert_sync_batchnorm(source().double())
    with torch.no_grad():
        twin.weight.uniform_(0.5, 1.5)
    plain = source().double() if not isinstance(twin, batchnorm.SyncBatchNorm) else nn.BatchNorm1d(3).double()
    plain.load_state_dict(twin.state_dict())  # (nn.SyncBatchNorm refuses the CPU: its semantics are BatchNorm1d's)
    x = torch.randn(*shape, dtype=torch.float64) * 3 + 1
    for mode in (True, False, True):
        plain.train(mode), twin.train(mode)
        assert torch.equal(twin(x), plain(x)) and torch.equal(twin.running_var, plain.running_var)
    with world_of_one():
        ref = plain(x)
        out = batchnorm.sync_batch_norm(twin, x)
    assert torch.allclose(out, ref, rtol=0, atol=1e-13)
    assert torch.allclose(twin.running_mean, plain.running_mean, rtol=1e-14, atol=1e-16)
    assert torch.allclose(twin.running_var, plain.running_var, rtol=1e-14, atol=0)
    assert int(twin.num_batches_tracked) == int(plain.num_batches_tracked) == 3


@pytest.mark.parametrize("call, message", [
    (lambda: batchnorm.convert_sync_batchnorm(nn.BatchNorm2d(2), process_group=object()),
     "convert_sync_batchnorm: torch_ref's synchronised BatchNorm reduces over the default process group"),
    (lambda: batchnorm.convert_sync_batchnorm(nn.Sequential(nn.SyncBatchNorm(2, process_group=object()))),
     "convert_sync_batchnorm: torch_ref's synchronised BatchNorm reduces over the default process group"),
    (lambda: batchnorm.convert_sync_batchnorm(nn.Sequential(type("MyNorm", (nn.modules.batchnorm._BatchNorm,), {})(2))),
     "convert_sync_batchnorm: MyNorm has no synchronised twin in torch_ref (nn.BatchNorm1d/2d/3d and "
     "nn.SyncBatchNorm have); build the model with one of those"),
])
def test_convert_refuses_in_one_line(call, message):
    with pytest.raises(ValueError) as e:
        call()
    assert str(e.value) == message or str(e.value).startswith(message)
    assert "\n" not in str(e.value)


def test_canonical_reduction_takes_a_converted_model():
    """`reduction='canonical'` (torch_ref/canonical/batchnorm.py) on the converted net, BatchNorm1d included: a
    single run equals the native one to roundoff."""
    runs = [_single_run(accum=2, reduction=r) for r in ("native", "canonical")]
    row = parity.judge(*runs, check_config=False)
    assert row.ok and row.worst["param"] < 1e-12, row.failures


# ---- the conv net at N=2 (the shared world) --------------------------------------------------------------
@functools.cache
def _single_run(accum: int, reduction: str = "native") -> trace.Trace:
    """The reference: the plain net, `single`, in this process (what every converted strategy must equal)."""
    net = R.fresh_net(convert=reduction == "canonical")
    model, opt = torch_ref.parallelize(net, strategy="single", optimizer=R.optimizer, accum=accum, reduction=reduction)
    with Recorder(None, {**R.META, "strategy": "single", "devices": 1, "accum": accum}, model) as rec:
        rec.init()
        for k in range(1, R.STEPS + 1):
            x, y = R.batch(k)
            rec.step(k, torch_ref.train_step(model, opt, torch.from_numpy(x), torch.from_numpy(y), F.cross_entropy),
                     x, y)
    return trace.Trace(rec.meta, rec.arrays)


def _case(case) -> trace.Trace:
    got = world(2)["bn"][0][case]
    return trace.Trace(got["meta"], got["arrays"])


def _spreads(t: trace.Trace) -> dict:
    return {k: float(v) for k, v in t.arrays.items() if is_spread(k)}


@pytest.mark.torch_jobs(("bn", 2))
@pytest.mark.parametrize("case", [c for c in R.CASES if c[2] and not c[3]], ids=lambda c: f"{c[0]}-accum{c[1]}")
def test_a_converted_net_equals_single_with_no_spread(case):
    t = _case(case)
    spreads = _spreads(t)
    params = 0 if case[0] in ("zero3", "hsdp") else 8  # FSDP2 parameters are shards: only the 4 buffers
    assert len(spreads) == R.STEPS * (params + 4) and set(spreads.values()) == {0.0}
    report = divergence.compare(t, _single_run(case[1]), check_config=False)
    assert report.ok, cli_diff.text(report)
    assert max(report.row.worst[f] for f in ("loss", "grad", "param")) < 1e-12


@pytest.mark.torch_jobs(("bn", 2))
@pytest.mark.parametrize("strategy, broadcast", [("ddp", True), ("zero3", False)])
def test_plain_batchnorm_spreads_and_the_judge_says_so(strategy, broadcast):
    """Plain nn.BatchNorm: each rank's running statistics from its own rows. Under ddp DDP gives every rank
    rank 0's at the next step's first forward (a note); under zero3 nothing does (a failure)."""
    t = _case(next(c for c in R.CASES if c[0] == strategy and not c[2]))
    spreads = _spreads(t)
    assert all(v == 0.0 for k, v in spreads.items() if k.endswith(("kernel", "scale", "bias")))
    assert all(spreads[f"step/{k}/spread/{n}"] > 1e-3 for k in (1, 2, 3) for n in ("bn/mean", "bn/var", "norm/mean"))
    assert t.meta.get("broadcast_buffers", False) is broadcast
    row = parity.judge(t, _single_run(t.meta["accum"]), check_config=False)
    found = row.diff["spread"]
    assert {f.name for f in found} == {"bn/mean", "bn/var", "norm/mean", "norm/var"}
    assert all(f.kind == "buffer" and f.fails is not broadcast and f.side == "a" for f in found)
    text = cli_diff.text(divergence.compare(t, _single_run(t.meta["accum"]), check_config=False))
    where = "note: " if broadcast else "MISMATCH:\n  "
    assert f"{where}spread: A: buffer bn/mean differs across ranks" in text
    assert "convert_sync_batchnorm" in text


@pytest.mark.torch_jobs(("bn", 2))
def test_a_parameter_perturbed_on_one_rank_is_caught_by_its_spread():
    """Rank 1 moves a parameter by 1e-3 after step 2 and makes a running variance NaN after step 3: rank 0's
    trace shows neither but in its spread, and the judge fails on both (NaN even with broadcast_buffers)."""
    t = _case(("ddp", 1, True, True))
    assert sorted(k for k, v in _spreads(t).items() if v) == ["step/2/spread/head/bias", "step/3/spread/head/bias",
                                                             "step/3/spread/norm/var"]
    assert math.isnan(_spreads(t)["step/3/spread/norm/var"]) and np.isfinite(t.arrays["step/3/state/norm/var"]).all()
    row = parity.judge(t, _single_run(1), check_config=False)
    assert row.failures[0].startswith("spread: a: parameter head/bias differs across ranks by up to 0.001 at step 2")
    assert row.failures[1].startswith("spread: a: buffer norm/var is not finite on some rank at step 3")
