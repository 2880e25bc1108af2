"""torch_ref as a library (`parallelize`, `train_step`, `trace.Recorder`) on a model the project
never saw: every torch strategy, N in {1, 2, 3}, accumulation 1 and 3, with and without clipping,
SGD with momentum and AdamW (a pairwise covering set; every strategy meets every N). Each step's
loss, gradient (before clipping) and parameters, as the Recorder wrote them in Flax names and
layout, equal an independent single-process torch reference written here, in float64, to 1e-10.

Why 1e-10: the strategies only reorder sums (ranks, micro-batches, buckets, shards), which moves
float64 results by ~1e-15 per step; a wrong algorithm (a missing 1/N, a shard's clipping norm, a
summed instead of averaged micro-batch) is off by O(1e-3) or more (test_a_wrong_step_is_caught).
The suite's shared torch world of N ranks (tests/torch_helpers.py) runs all of that N's cases; the
rank side is tests/torch_api_ranks.py.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_ref
from jaxdp.core.traces import trace
from jaxdp.core.traces.spread import is_spread
from tests.torch_api_ranks import (
    BATCH,
    CASES,
    DIMENSIONS,
    FEATURES,
    HIDDEN,
    OPTIMIZERS,
    STEPS,
    UNITS,
    Net,
    batch,
    fresh_net,
)
from tests.torch_helpers import world
from torch_ref.strategies.zero import zero3
from torch_ref.trace import Recorder

TOL = 1e-10


def flax(named: dict) -> dict:
    """This test's own torch -> Flax mapping (kernels transposed), independent of torch_ref's."""
    out = {}
    for name, t in named.items():
        module, leaf = name.split(".")
        leaf = {"weight": "kernel" if module != "norm" else "scale"}.get(leaf, leaf)
        t = t.detach().numpy()
        out[f"{module}/{leaf}"] = t.T.copy() if leaf == "kernel" else t.copy()
    return out


@functools.cache
def reference(optimizer: str, clip_norm: float) -> dict:
    """Plain torch, one process, the whole batch per step: the trace arrays it implies."""
    net = fresh_net()
    opt = OPTIMIZERS[optimizer](net.parameters())
    arrays = {f"init/{k}": v for k, v in flax(dict(net.named_parameters())).items()}
    for k in range(1, STEPS + 1):
        x, y = batch(k)
        opt.zero_grad()
        loss = F.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        arrays[f"step/{k}/loss"] = np.float64(loss.item())
        grads = flax({n: p.grad for n, p in net.named_parameters()})
        arrays.update({f"step/{k}/grad/{n}": g for n, g in grads.items()})
        if clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip_norm)
        opt.step()
        arrays.update({f"step/{k}/param/{n}": v for n, v in flax(dict(net.named_parameters())).items()})
    return arrays


def api_results(n: int) -> list[dict]:
    """Every rank's results of world size n's cases (run in the suite's shared torch world of n ranks)."""
    return world(n)["api"]


def worst_error(arrays: dict, ref: dict) -> tuple[float, str]:
    ref = {k: v for k, v in ref.items() if not is_spread(k)}  # the ranks' agreement: no trace value
    assert set(arrays) >= set(ref), sorted(set(ref) - set(arrays))[:5]
    errors = {k: float(np.max(np.abs(arrays[k] - ref[k])) / max(np.max(np.abs(ref[k])), 1e-300)) for k in ref}
    return max((v, k) for k, v in errors.items())


# ---- the checks ----------------------------------------------------------------------------------
def test_cases_cover_every_strategy_with_every_n_and_every_pair():
    assert len(CASES) == len(DIMENSIONS["strategy"]) * len(DIMENSIONS["devices"])
    for a in DIMENSIONS:
        for b in DIMENSIONS:
            if a < b:
                met = {(c[list(DIMENSIONS).index(a)], c[list(DIMENSIONS).index(b)]) for c in CASES}
                assert met == {(x, y) for x in DIMENSIONS[a] for y in DIMENSIONS[b]}, (a, b)


@pytest.mark.torch_jobs(lambda p: [("api", p["case"][1])])
@pytest.mark.parametrize("case", CASES + [UNITS], ids=lambda c: "-".join(map(str, c)))
def test_every_step_equals_the_plain_torch_reference(case):
    per_rank = api_results(case[1])
    got = per_rank[0][case]
    error, key = worst_error(got["arrays"], reference(case[3], case[4]))
    assert error <= TOL, f"{case}: {key} off by {error:.2e}"
    for other in per_rank[1:]:  # the global mean loss, the same float on every rank
        assert other[case]["losses"] == got["losses"]


@pytest.mark.torch_jobs(("api", 2))
def test_the_recorder_wrote_a_trace_jaxdp_reads():
    t = trace.load(world(2)["api_trace"])
    assert t.meta["framework"] == "torch" and t.meta["devices"] == 2
    assert t.arrays["init/inp/kernel"].shape == (FEATURES, HIDDEN) and "init/out/bias" not in t.arrays
    assert t.arrays["step/3/x"].shape == (BATCH, FEATURES) and f"step/{STEPS}/grad/norm/scale" in t.arrays


def test_clipping_was_active():
    ref = reference("momentum", 0.2)
    norm = np.sqrt(sum(np.sum(v ** 2) for k, v in ref.items() if k.startswith("step/1/grad/")))
    assert norm > 0.2


def _single_model(accum=1):
    return torch_ref.parallelize(fresh_net(), strategy="single", optimizer=OPTIMIZERS["adamw"], accum=accum)


def _single(loss_fn=F.cross_entropy, accum=3, recorder=True):
    model, opt = _single_model(accum)
    rec = Recorder(None, {}, model) if recorder else None
    if rec:
        rec.init()
    for k in range(1, STEPS + 1):
        x, y = batch(k)
        loss = torch_ref.train_step(model, opt, torch.from_numpy(x), torch.from_numpy(y), loss_fn, clip_norm=0.2)
        if rec:
            rec.step(k, loss, x, y)
    return model, rec


def test_a_wrong_step_is_caught():
    """The harness can fail: micro-batch losses summed, not averaged (F.cross_entropy with
    reduction='sum' / rows: each micro-batch's mean, but accum times too large a step's gradient)."""
    def summed(out, y):
        return F.cross_entropy(out, y) * 3
    _, rec = _single(summed)
    error, key = worst_error(rec.arrays, reference("adamw", 0.2))
    assert error > 1e-3 and "grad" in key


def test_gradients_are_kept_only_while_a_recorder_is_attached():
    model, _ = _single(recorder=False)
    assert torch_ref.api.state_of(model).grads is None
    model, rec = _single()
    rec.close(write=False)
    state = torch_ref.api.state_of(model)
    assert not state.return_grads and state.grads is None


def test_recorder_names_override_the_automatic_mapping():
    model, _ = _single_model()
    rec = Recorder(None, {}, model, names={"inp.weight": "first/w"})
    rec.init()
    assert rec.arrays["init/first/w"].shape == (FEATURES, HIDDEN) and "init/inp/kernel" not in rec.arrays
    with pytest.raises(ValueError, match="names= has 'nope.weight': no such torch parameter"):
        Recorder(None, {}, model, names={"nope.weight": "x"})  # refused at construction, not at the first step


@pytest.mark.parametrize("call, message", [
    (lambda: torch_ref.parallelize(Net(), strategy="ddp", optimizer=OPTIMIZERS["adamw"]),
     "strategy 'ddp' needs an initialised process group: call torch.distributed.init_process_group"),
    (lambda: torch_ref.parallelize(Net(), strategy="zero4", optimizer=OPTIMIZERS["adamw"]),
     "unknown strategy 'zero4'; valid: single, dp, ddp"),
    (lambda: torch_ref.parallelize(Net(), strategy="single", optimizer=OPTIMIZERS["adamw"], bucket_mb=1),
     "strategy 'single' takes no option 'bucket_mb'; its options: none"),
    (lambda: torch_ref.parallelize(Net(), strategy="single", optimizer=OPTIMIZERS["adamw"], accum=0),
     "accum must be a positive int"),
    (lambda: torch_ref.parallelize(Net(), strategy="single", optimizer=torch.optim.SGD([torch.zeros(1)], lr=1)),
     "optimizer must be a callable from parameters to a torch.optim.Optimizer"),
    (lambda: _single(accum=4), "the ranks got [18] rows; give every rank the same multiple of accum=4 rows"),
    (lambda: _single(lambda out, y: F.cross_entropy(out, y, reduction="none")),
     "loss_fn returned (6,), not a scalar tensor; return the mean loss"),
    (lambda: torch_ref.train_step(*_single_model(), torch.zeros(4, FEATURES), torch.zeros(3), F.cross_entropy),
     "x has 4 rows but y has 3; pass this rank's rows of both"),
    (lambda: torch_ref.train_step(_single_model()[0], None, torch.zeros(1), torch.zeros(1), F.cross_entropy),
     "optimizer is not the one parallelize returned with this model; pass that optimizer"),
    (lambda: zero3.apply_fsdp(Net(), units=[nn.Linear(2, 2)]),  # checked before any process group is used
     "units= holds Linear, not a submodule of the model being parallelized; pass its own submodules"),
    (lambda: Recorder(None, {}, Net()), "Net was not returned by torch_ref.parallelize; call model, optimizer = "),
    (lambda: torch_ref.train_step(Net(), None, torch.zeros(1), torch.zeros(1), F.cross_entropy),
     "Net was not returned by torch_ref.parallelize"),
])
def test_bad_input_is_one_line_naming_the_fix(call, message):
    with pytest.raises(ValueError) as e:
        call()
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.torch_jobs(("api", 2))
def test_unequal_rows_across_ranks_are_one_error_on_every_rank():
    """6 rows on rank 0, 7 on rank 1: DDP would average the ranks' means into a wrong gradient, and a
    rank refusing its rows alone would leave the others waiting in a collective."""
    messages = [r["unequal_rows"] for r in api_results(2)]
    assert messages == [messages[0]] * 2, messages
    assert "the ranks got [6, 7] rows; give every rank the same multiple of accum=1 rows" in messages[0]
