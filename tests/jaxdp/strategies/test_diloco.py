"""diloco in JAX (local SGD with an outer Nesterov step every K steps) against its two oracles, in float64 to
1e-12 relative (the tolerance argued in test_strategies.py: only sums are reordered):
- K = 1 with outer SGD at lr 1, no momentum, and inner SGD is ddp (the outer step then sets the parameters to the
  replicas' mean, which after one SGD step from the same point is ddp's step);
- in general, `diloco_reference.simulate` (N replicas in one process), step by step: loss, mean gradient, mean
  parameters, with accumulation, clipping and adamw.
Each check fails on a broken diloco (outer lr 0.9 for ddp; the momentum dropped or the mean not divided by N for the
simulation). The flags are refused in one line on other strategies and out of range. The torch twin:
tests/torch_ref/strategies/test_torch_diloco.py.
"""
from __future__ import annotations

import re

import jax
import numpy as np
import pytest

from jaxdp import train
from jaxdp.core.run.config import ConfigError
from jaxdp.strategies import diloco
from jaxdp.strategies.diloco_reference import simulate
from tests.conftest import BASE, run
from tests.jaxdp.harness.test_cli import error_of

TOL = 1e-12
AS_DDP = BASE.replace(strategy="diloco", devices=2, steps=3, optimizer="sgd", inner_steps=1, outer_lr=1.0,
                      outer_momentum=0.0)
GENERAL = BASE.replace(strategy="diloco", devices=2, steps=4, optimizer="adamw", accum=2, clip_norm=0.5,
                       inner_steps=2)


def worst(got: dict, ref: dict) -> tuple[float, str]:
    """The largest relative error over the arrays of `ref` (max |a - b| / max |b|), and its key."""
    errors = {k: float(np.max(np.abs(got[k] - b)) / max(float(np.max(np.abs(b))), 1e-300)) for k, b in ref.items()}
    key = max(errors, key=errors.get)
    return errors[key], key


def steps_of(arrays: dict) -> dict:
    """A trace's per-step arrays: loss, grads, params (not the batch, nor torch's spread across ranks)."""
    return {k: np.asarray(v) for k, v in arrays.items() if k.startswith("step/")
            and k.split("/")[2] in ("loss", "grad", "param")}


def path(keys) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in keys)


def simulated(cfg) -> dict:
    """`cfg`'s run as `simulate` computes it, keyed as a trace."""
    _, dataset, problem, optimizer, _ = train.prepare(cfg)
    batches = (train.host_batch(cfg, dataset, k) for k in range(1, cfg.steps + 1))
    out = {}
    for k, (loss, grads, params) in enumerate(simulate(problem.loss_fn, optimizer, problem.params, batches,
                                                       cfg.devices, cfg.accum, cfg.inner_steps, cfg.outer_lr,
                                                       cfg.outer_momentum), start=1):
        out[f"step/{k}/loss"] = np.asarray(loss)
        for name, tree in (("grad", grads), ("param", params)):
            for keys, a in jax.tree_util.tree_flatten_with_path(tree)[0]:
                out[f"step/{k}/{name}/{path(keys)}"] = np.asarray(a)
    return out


def test_k1_outer_sgd_lr1_inner_sgd_equals_ddp():
    got, ref = run(AS_DDP), run(AS_DDP.replace(strategy="ddp", inner_steps=4, outer_lr=0.7, outer_momentum=0.9))
    error, key = worst(steps_of(got.arrays), steps_of(ref.arrays))
    assert error < TOL, (key, error)


def test_the_ddp_oracle_fails_on_another_outer_lr():
    got = run(AS_DDP.replace(outer_lr=0.9))
    ref = run(AS_DDP.replace(strategy="ddp", inner_steps=4, outer_lr=0.7, outer_momentum=0.9))
    assert worst(steps_of(got.arrays), steps_of(ref.arrays))[0] > 1e-4


@pytest.mark.parametrize("cfg", [GENERAL, GENERAL.replace(devices=3, batch_size=72, inner_steps=3, steps=4,
                                                          optimizer="momentum", accum=1, clip_norm=0.0)],
                         ids=["x2-adamw-K2-acc2-clip", "x3-momentum-K3"])
def test_diloco_equals_the_one_process_simulation_step_by_step(cfg):
    got, ref = steps_of(run(cfg).arrays), simulated(cfg)
    assert sorted(got) == sorted(ref)
    error, key = worst(got, ref)
    assert error < TOL, (key, error)


@pytest.mark.parametrize("broken", ["no momentum", "sum not mean"])
def test_the_simulation_oracle_fails_on_a_broken_diloco(monkeypatch, broken):
    if broken == "no momentum":
        sgd = diloco.outer_sgd
        monkeypatch.setattr(diloco, "outer_sgd", lambda o, b, m, lr, mu: sgd(o, b, m, lr, 0.0))
    else:
        monkeypatch.setattr(diloco, "mean_over_replicas", lambda tree, n: jax.lax.psum(tree, diloco.AXIS))
    got = train.run(GENERAL, record=True, progress=False)
    assert worst(steps_of(got.arrays), simulated(GENERAL))[0] > 1e-4


@pytest.mark.parametrize("argv,named", [
    (["--strategy", "ddp", "--inner-steps", "4"], "--inner-steps"),
    (["--strategy", "zero2", "--outer-lr", "0.5"], "--outer-lr"),
    (["--strategy", "diloco", "--inner-steps", "0"], "--inner-steps 0"),
    (["--strategy", "diloco", "--outer-momentum", "-0.1"], "--outer-momentum"),
])
def test_a_diloco_flag_out_of_place_is_one_line(capsys, argv, named):
    err = error_of(["train", *argv, "--devices", "2", "--steps", "1"], capsys)
    assert named in err and ("drop" in err or "must be" in err), err


@pytest.mark.parametrize("changes,named", [
    (dict(strategy="ddp", inner_steps=8), "--inner-steps 8 is for --strategy diloco"),
    (dict(strategy="diloco", model="cnn", data="digits"), "no --model cnn"),
    (dict(strategy="diloco", checkpoint_dir="ck", checkpoint_every=2), "does not checkpoint"),
])
def test_the_library_refuses_what_the_command_line_does(changes, named):
    with pytest.raises(ConfigError, match=named):
        BASE.replace(devices=2, **changes).validate()


def all_reduces(cfg) -> dict[str, list[str]]:
    """The compiled step's all-reduces, by the computation that holds them: {'ENTRY': [...], 'branch': [...]}."""
    from jaxdp.analysis import accounting

    text = accounting.compile_step(cfg).program.as_text()
    branches = set(re.findall(r"branch_computations=\{([^}]*)\}", text))
    names = {n.strip().lstrip("%") for group in branches for n in group.split(",")}
    found: dict[str, list[str]] = {"ENTRY": [], "branch": []}
    for comp in re.split(r"\n(?=\S)", text):
        name = comp.split(" ")[1].lstrip("%") if comp.startswith("ENTRY") else comp.split(" ")[0].lstrip("%")
        where = "ENTRY" if comp.startswith("ENTRY") else "branch" if name in names else None
        if where:
            found[where] += [line for line in comp.split("\n") if " all-reduce(" in line]
    return found


def test_the_compiled_step_sends_only_the_loss_but_in_the_outer_steps_branch():
    """An untraced step: one scalar all-reduce (the loss) on every step; the parameters' all-reduce only in the
    conditional's branch, taken every K-th step. Always communicating (the branch computed on every step and
    selected) puts the parameters' all-reduce in the step's entry: the check fails."""
    got = all_reduces(GENERAL.replace(steps=1))
    assert len(got["ENTRY"]) == 1 and "f64[] all-reduce(" in got["ENTRY"][0], got["ENTRY"]
    assert len(got["branch"]) == 1 and "f64[32,16]" in got["branch"][0], got["branch"]


def test_the_compiled_step_check_fails_on_a_diloco_that_communicates_every_step(monkeypatch):
    def select(pred, yes, no, *args):
        return jax.tree.map(lambda a, b: jax.numpy.where(pred, a, b), yes(*args), no(*args))

    monkeypatch.setattr(diloco.lax, "cond", select)
    got = all_reduces(GENERAL.replace(steps=1, inner_steps=3))
    assert any("f64[32,16]" in line for line in got["ENTRY"]), got


@pytest.mark.parametrize("always", [False, True])
def test_the_contract_keeps_the_outer_branch_and_finds_an_every_step_all_reduce(monkeypatch, always):
    """The contract (`jaxdp inspect`'s) of the compiled step: kept, its bytes per step the textbook's (the
    branch's all-reduce counted once per K steps); the branch computed on every step: `sync-every-step`."""
    from jaxdp.analysis import accounting
    from jaxdp.contract import strategies as contract

    if always:
        monkeypatch.setattr(diloco.lax, "cond", lambda pred, yes, no, *args: jax.tree.map(
            lambda a, b: jax.numpy.where(pred, a, b), yes(*args), no(*args)))
    cfg = GENERAL.replace(steps=1, inner_steps=3, accum=1)
    report = contract.of_compiled(accounting.compile_step(cfg), cfg)
    assert [f.kind for f in report.findings] == (["sync-every-step"] if always else [])
    if not always:
        assert report.facts["bytes_per_step"] == pytest.approx(report.facts["theory_bytes_per_step"], rel=1e-12)


def _bytes(line: str) -> int:
    """An all-reduce line's bytes: the elements of every f64 result it returns (one or a tuple) x 8."""
    result = line.split(" all-reduce(")[0]
    return sum(8 * int(np.prod([int(d) for d in dims.split(",") if d]))
               for dims in re.findall(r"f64\[([0-9,]*)\]", result))


@pytest.mark.parametrize("k", [2, 3])
def test_the_theory_and_the_contract_expect_the_parameters_all_reduce_once_per_k_steps(k):
    """The theory of bytes (inspect's, the contract's textbook) is the compiled step's entry (the loss's scalar,
    every step) plus its outer branch's all-reduce (the parameters) divided by K; 2 devices: the ring sends each
    all-reduce's bytes once. ddp's per-step gradient all-reduce (the branch's bytes whole) is not it."""
    from jaxdp.analysis import accounting
    from jaxdp.contract import strategies as contract

    cfg = GENERAL.replace(steps=1, inner_steps=k, accum=1)
    got = all_reduces(cfg)
    want = sum(map(_bytes, got["ENTRY"])) + sum(map(_bytes, got["branch"])) / k
    step = accounting.compile_step(cfg)
    sizes = [int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(step.problem.params)]
    assert accounting.theory_for(cfg, sizes)["total"] == pytest.approx(want, rel=1e-12)
    report = contract.of_compiled(step, cfg)
    assert report.facts["theory_bytes_per_step"] == pytest.approx(want, rel=1e-12)
    assert report.facts["theory_bytes_per_step"] < sum(map(_bytes, got["ENTRY"] + got["branch"]))
