"""hsdp in JAX (zero3 on an R x S grid): the same trace as `single` (float64, 1e-12, the tolerance argued in
test_strategies.py) for R x S in {2x2, 4x2, 2x4, 1x4, 4x1} with accumulation and clipping; the compiled
program gathers and reduce-scatters within a group and all-reduces only Psi / S across groups; a bad
--replicas is one line. Each check is shown to fail on a broken hsdp (the cross-group all-reduce
skipped; an all-reduce across groups before the reduce-scatter). The torch twin: test_torch_strategies.py.
"""
from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from jax import lax

from jaxdp import train
from jaxdp.analysis import accounting, hlo, inspect, theory
from jaxdp.core.run.config import ConfigError
from jaxdp.core.traces import trace
from jaxdp.harness import torch_cli
from jaxdp.strategies.zero import flat, layout
from tests.conftest import BASE, run
from tests.helpers import as_trace, assert_judged_ok
from tests.jaxdp.harness.test_cli import error_of
from tests.jaxdp.strategies.test_strategies import TOL

# (R, S) with each value of the collectives and reshard-after-forward; two optimizers (zero3's tests cover all
# four), so that two `single` runs are the references of all five
GRIDS = [((2, 2), "adamw", "xla", True), ((4, 2), "adamw", "xla", False), ((2, 4), "momentum", "ring", True),
         ((1, 4), "momentum", "xla", True), ((4, 1), "adamw", "ring", True)]
HLO = BASE.replace(strategy="hsdp", devices=8, replicas=4, accum=3, clip_norm=0.5, steps=1)


def hsdp(r, s, **changes):
    return BASE.replace(strategy="hsdp", devices=r * s, replicas=r, accum=3, clip_norm=0.5, **changes)


def single_of(cfg):
    return cfg.replace(strategy="single", devices=1, replicas=1, collectives="xla", reshard_after_forward=True)


@pytest.mark.parametrize("grid,optimizer,collectives,reshard", GRIDS, ids=lambda v: str(v))
def test_hsdp_equals_single(grid, optimizer, collectives, reshard):
    cfg = hsdp(*grid, optimizer=optimizer, collectives=collectives, reshard_after_forward=reshard)
    got, ref = run(cfg), run(single_of(cfg))
    bad = {k: v for k, v in trace.diff(as_trace(got), as_trace(ref))["per_array"].items() if v > TOL}
    assert not bad, sorted(bad.items(), key=lambda kv: -kv[1])[:5]
    assert_judged_ok(got, ref)


def cross_group_errors(cfg) -> list[str]:
    """What the compiled step of `cfg` (R x S = 4 x 2) does wrong, read from its HLO: gathers and
    reduce-scatters over more than a group; all-reduces across the groups of more than Psi / S elements;
    an all-reduce over every device of more than the scalars (the loss, the clip's sums of squares)."""
    r, s = cfg.replicas, cfg.devices // cfg.replicas
    c = accounting.compile_step(cfg)
    found = hlo.collectives_in_order(c.program.as_text(), cfg.devices)
    sizes = [p.size for p in jax.tree.leaves(c.problem.params)]
    errors = [f"{x['op']} over {x['group']}" for x in found if x["op"] in ("all-gather", "reduce-scatter")
              and x["group"] != s]
    across = sum(x["elements"] * x["trips"] for x in found if x["op"] == "all-reduce" and x["group"] == r)
    if across != sum(math.ceil(n / s) for n in sizes):
        errors.append(f"{across} elements all-reduced across groups, not Psi / S")
    errors += [f"all-reduce of {x['elements']} over all" for x in found
               if x["op"] == "all-reduce" and x["group"] == cfg.devices and x["elements"] > len(sizes)]
    return errors


def test_compiled_step_keeps_gathers_in_the_group_and_sends_psi_over_s_across():
    assert cross_group_errors(HLO) == []


def test_the_checks_fail_on_a_broken_hsdp(monkeypatch):
    """Skipping the all-reduce across groups (each group's own mean): the trace is off single's; the
    all-reduce across groups before the reduce-scatter (the full gradient crosses): the HLO check fails."""
    monkeypatch.setattr(flat, "across_groups", lambda comm, axis: comm._replace(replica=axis))
    cfg = hsdp(2, 2, optimizer="adamw")
    got, ref = train.run(cfg, record=True, progress=False), run(single_of(cfg))
    worst = trace.diff(as_trace(got), as_trace(ref))["worst"]
    assert max(worst.values()) > 1e-4, worst
    monkeypatch.setattr(flat, "across_groups", lambda comm, axis: comm._replace(
        replica=axis, reduce_scatter=lambda x: comm.reduce_scatter(lax.psum(x, axis))))
    assert any("not Psi / S" in e for e in cross_group_errors(HLO.replace(seed=4)))


# (R, S, reshard-after-forward, accum) at N = 8: the bytes within a group and across, measured = theory
BYTES = [(2, 4, True, 1), (2, 4, False, 1), (4, 2, True, 3)]


def group_errors(cfg) -> list[str]:
    """Where `jaxdp inspect` of `cfg` does not match the theory: the bytes within a group and across
    the groups, each collective's group (gathers and reduce-scatters within a group of S)."""
    r = inspect.inspect(cfg)
    s = cfg.devices // cfg.replicas
    errors = [f"{k}: {r[k]} measured, {r['theory_' + k]} theory" for k in ("bytes_intra_group", "bytes_inter_group")
              if r[k] != pytest.approx(r["theory_" + k], rel=1e-12, abs=1e-9)]
    errors += [f"{c['op']} over {c['group_size']}" for c in r["collectives"]
               if c["op"] in ("all-gather", "reduce-scatter") and (c["group_size"] != s or c["inter_group"])]
    assert r["bytes_per_device"] == pytest.approx(r["bytes_intra_group"] + r["bytes_inter_group"])
    return errors


@pytest.mark.parametrize("r,s,reshard,accum", BYTES, ids=lambda v: str(v))
def test_bytes_within_and_across_groups_equal_the_theory(r, s, reshard, accum):
    cfg = HLO.replace(replicas=r, devices=r * s, reshard_after_forward=reshard, accum=accum, clip_norm=0.0)
    assert group_errors(cfg) == []


def test_the_group_bytes_check_fails_on_a_broken_step_or_theory(monkeypatch):
    """The all-reduce across groups before the reduce-scatter (Psi crosses, not Psi / S); the theory's
    term across groups over Psi instead of Psi / S."""
    cfg = HLO.replace(replicas=2, clip_norm=0.0, accum=1, seed=5)
    with monkeypatch.context() as m:
        m.setattr(flat, "across_groups", lambda comm, axis: comm._replace(
            replica=axis, reduce_scatter=lambda x: comm.reduce_scatter(lax.psum(x, axis))))
        assert any(e.startswith("bytes_inter_group") for e in group_errors(cfg))
    monkeypatch.setattr(theory, "across_groups", lambda psi_s, r, b: 2 * (r - 1) / r * psi_s * 4 * b)
    assert any(e.startswith("bytes_inter_group") for e in group_errors(cfg.replace(seed=6)))


@pytest.mark.parametrize("argv,message", [
    (["--strategy", "hsdp", "--replicas", "3", "--devices", "4"], "--replicas 3 must divide --devices 4: give one of "
                                                                  "1, 2, 4"),
    (["--strategy", "ddp", "--replicas", "2", "--devices", "4"], "--replicas is read only by --strategy hsdp, not ddp: "
                                                                 "drop --replicas"),
    (["--strategy", "hsdp", "--model", "cnn", "--data", "digits", "--devices", "2"], "hsdp has no --model cnn")])
def test_bad_replicas_is_one_line_in_both_frameworks(argv, message, capsys):
    err = error_of(["train", *argv], capsys)
    assert message in err and len(err.strip().splitlines()) == 1
    assert torch_cli.main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_library_refuses_replicas_that_do_not_divide_and_other_strategies():
    import optax

    from jaxdp import parallelize

    def loss(p, x, y):
        return ((x @ p["w"] - y) ** 2).mean()

    params = {"w": np.zeros((3, 1))}
    with pytest.raises(ConfigError, match="replicas=3 does not divide the 4 devices; give one of 1, 2, 4"):
        parallelize(loss, params, optax.sgd(0.1), strategy="hsdp", devices=4, replicas=3)
    with pytest.raises(ConfigError, match="takes no option replicas"):
        parallelize(loss, params, optax.sgd(0.1), strategy="zero3", devices=4, replicas=2)
    par = parallelize(loss, params, optax.sgd(0.1), strategy="hsdp", devices=4, replicas=2)
    assert par.strategy.name == "hsdp" and dict(par.init().params["w"].sharding.mesh.shape) == {"replica": 2,
                                                                                                 "data": 2}


def test_state_per_device_is_zero3s_at_s():
    """Parameters and Adam's state on device 0: the ZeRO formula with S = N / R (zero3's on S devices)."""
    cfg = BASE.replace(strategy="hsdp", devices=8, replicas=4, optimizer="adam", dtype="float32")
    devices, _, problem, optimizer, strategy = train.prepare(cfg, False)
    state = strategy.init(problem.params)
    sizes = [p.size for p in jax.tree.leaves(problem.params)]
    expected = accounting.formula(layout.of("hsdp"), sizes, 2, 4, 4, 8, replicated_state_bytes=4)  # Adam's count
    measured = {part: accounting.bytes_on(getattr(state, part), devices[0]) for part in ("params", "opt_state")}
    assert measured == {part: expected[part] for part in measured}
    assert expected["params"] == 4 * sum(-(-n // 2) for n in sizes)
