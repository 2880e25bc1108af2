"""`jaxdp.diff` and what it judges without help: a trace that lacks the optimizer's settings is judged
by its gradients' disagreement (jaxdp/judge/unmodelled.py) and the verdict says in one line what is
missing; a resumed trace is judged over the steps it shares with the full run; after the first
divergence the relaxed tensors are a count. Each check in both directions: honest pairs pass, planted
bugs fail. Synthetic traces (test_error_model.py's AdamW runs, test_divergence.py's user trace, both in
this folder), no training."""
from __future__ import annotations

import json

import pytest

import jaxdp
from jaxdp.core.errors import ConfigError
from jaxdp.core.traces import trace
from jaxdp.harness import cli
from jaxdp.judge import divergence
from tests.jaxdp.judge.test_error_model import BUGS, run

SETTINGS = ("optimizer", "lr", "weight_decay")


def unrecorded(t: trace.Trace) -> trace.Trace:
    """`t` as the porting recipe used to record it: meta without the optimizer's settings."""
    return trace.Trace({k: v for k, v in t.meta.items() if k not in SETTINGS}, t.arrays)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_honest_runs_without_the_optimizer_settings_pass_and_say_what_is_missing(dtype):
    report = divergence.compare(unrecorded(run(dtype, 1)), unrecorded(run(dtype, 2)), check_config=False)
    assert report.ok, report.failures
    missing = [n for n in report.notes if "optimizer settings not recorded" in n]
    assert len(missing) == 1 and "'optimizer' and 'lr'" in missing[0] and "Recorder(..., optimizer=" in missing[0]
    assert {r.split(", ")[2].split(" at")[0] for r in report.relaxed} == {"attn/bias"}  # the roundoff-only bias


@pytest.mark.parametrize("bug", BUGS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_small_bugs_fail_without_the_optimizer_settings(bug, dtype):
    report = divergence.compare(unrecorded(run(dtype, 1, **BUGS[bug])), unrecorded(run(dtype, 2)),
                                check_config=False)
    assert not report.ok, bug
    assert report.first.field == "param", report.first.describe()


def test_identical_gradients_leave_no_allowance():
    a = unrecorded(run(run_seed=1))
    arrays = dict(a.arrays)
    arrays["step/3/param/wte"] = arrays["step/3/param/wte"] + 1e-9  # past the storage rounding
    report = divergence.compare(trace.Trace(a.meta, arrays), a, check_config=False)
    assert not report.ok and (report.first.step, report.first.name) == (3, "wte")


def resumed_from(t: trace.Trace, first: int) -> trace.Trace:
    """`t` as a run resumed after step first - 1 records it: its values then as `init/`, steps from `first`."""
    arrays = {k: v for k, v in t.arrays.items() if (step := trace.parse_key(k).step) is None or step >= first}
    arrays |= {f"init/{n}": t.arrays[f"step/{first - 1}/param/{n}"] for n in t.names()}
    return trace.Trace({**t.meta, "first_step": first}, arrays)


@pytest.mark.parametrize("late", ["a", "b"])
def test_a_resumed_trace_is_judged_over_the_steps_it_shares_with_the_full_run(late):
    full = run(run_seed=1)
    pair = (resumed_from(full, 3), full) if late == "a" else (full, resumed_from(full, 3))
    v = jaxdp.diff(*pair)
    assert v.ok, v.text()
    assert v.steps == (3, 5) and any("compared over steps 3..5" in n for n in v.notes), v.notes


def test_a_resumed_trace_with_a_mutated_shared_step_or_start_fails():
    full = run(run_seed=1)
    bad = resumed_from(full, 3)
    arrays = dict(bad.arrays, **{"step/4/param/wte": bad.arrays["step/4/param/wte"] * (1 + 1e-6)})
    v = jaxdp.diff(trace.Trace(bad.meta, arrays), full)
    assert not v.ok and (v.first.step, v.first.field, v.first.name) == (4, "param", "wte"), v.text()
    arrays = dict(bad.arrays, **{"init/wte": bad.arrays["init/wte"] * (1 + 1e-6)})  # resumed from other bits
    v = jaxdp.diff(trace.Trace(bad.meta, arrays), full)
    assert not v.ok and (v.first.step, v.first.field, v.first.name) == (2, "init", "wte"), v.text()


def test_traces_without_a_step_in_common_are_one_clear_error():
    full = run(run_seed=1)
    short = trace.Trace({**full.meta, "steps": 2}, {k: v for k, v in full.arrays.items()
                                                    if not k.startswith(("step/3/", "step/4/", "step/5/"))})
    with pytest.raises(trace.TraceError, match="no step in common"):
        jaxdp.diff(resumed_from(full, 4), short, check_config=False)


def near(k, n, up, p):
    """A key-bias element at step 2 far beyond its roundoff allowance (tests/jaxdp/judge/test_error_model.py)."""
    up = up.copy()
    if (k, n) == (2, "attn/bias"):
        up[5] += 1e-9
    return up


def test_after_a_divergence_the_relaxed_tensors_are_one_count_line(tmp_path):
    honest = jaxdp.diff(run(run_seed=1), run(run_seed=2), check_config=False)
    assert honest.ok and honest.relaxed
    assert f"within bounds by the error model ({len(honest.relaxed)}:" in honest.text()
    v = jaxdp.diff(run(run_seed=1, bug=near), run(run_seed=2), check_config=False)
    assert not v.ok and v.relaxed, v.text()
    lines = [line for line in v.text().splitlines() if "within bounds by the error model" in line]
    assert lines == [lines[0]] and f": {len(v.relaxed)} tensors" in lines[0]
    assert not any(r.describe(None) in v.text() for r in v.relaxed)
    assert len(v.to_json()["relaxed"]) == v.to_json()["relaxed_count"] == len(v.relaxed)


def test_diff_takes_paths_or_traces_and_its_json_is_the_cli_s(tmp_path, capsys):
    a, b = run(run_seed=1, bug=near), run(run_seed=2)
    paths = [str(tmp_path / "a.npz"), str(tmp_path / "b.npz")]
    for p, t in zip(paths, (a, b), strict=True):
        trace.save(p, t.meta, t.arrays)
    v = jaxdp.diff(*paths, check_config=False)
    assert isinstance(v, jaxdp.Verdict) and v.first == jaxdp.diff(a, b, check_config=False).first
    assert v.findings[0] is v.first and v.failures
    assert cli.main(["diff", *paths, "--no-config-check", "--json", str(tmp_path / "d.json")]) == 1
    assert capsys.readouterr().out.startswith(v.text())
    doc = json.loads((tmp_path / "d.json").read_text())
    assert doc == json.loads(json.dumps(v.to_json()))
    assert {"ok", "first_divergence", "a", "b", "bounds", "failures", "notes", "steps", "relaxed", "spread",
            "divergences", "table"} <= set(doc)
    with pytest.raises(ConfigError, match="trace A"):
        jaxdp.diff(str(tmp_path / "none.npz"), b)
    with pytest.raises(ConfigError, match="tolerance"):
        jaxdp.diff(a, b, tolerance=-1.0)


def test_a_torch_optimizer_s_param_groups_are_its_settings():
    torch = pytest.importorskip("torch")
    from jaxdp.core.run import optimizer_settings

    p = [torch.nn.Parameter(torch.zeros(3))]
    assert optimizer_settings.settings(torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01)) == {
        "optimizer": "adamw", "lr": 1e-3, "weight_decay": 0.01, "adam_betas": [0.9, 0.999], "adam_eps": 1e-8}
    assert optimizer_settings.settings(torch.optim.SGD(p, lr=0.1, momentum=0.9))["optimizer"] == "momentum"
    assert optimizer_settings.settings(torch.optim.SGD(p, lr=0.1))["optimizer"] == "sgd"
    q = [torch.nn.Parameter(torch.zeros(2))]
    groups = torch.optim.SGD([{"params": p}, {"params": q, "lr": 0.2}], lr=0.1)
    with pytest.raises(ConfigError, match="param groups differ in lr"):
        optimizer_settings.settings(groups)


def test_recorded_settings_are_replayed_and_the_missing_line_goes():
    from jaxdp.core.run import optimizer_settings

    a, b = (unrecorded(run(run_seed=s)) for s in (1, 2))
    settings = {"name": "adamw", "lr": 1e-3, "weight_decay": 0.01}
    a, b = (trace.Trace(optimizer_settings.merged(t.meta, settings), t.arrays) for t in (a, b))
    v = jaxdp.diff(a, b, check_config=False)
    assert v.ok and not any("not recorded" in n for n in v.notes) and any("adamw (lr 0.001" in n for n in v.notes)


def with_meta(t: trace.Trace, **meta) -> trace.Trace:
    return trace.Trace({**t.meta, **meta}, t.arrays)


def test_the_verdict_says_which_kernels_each_trace_ran_in_one_line():
    a, b = run("float32", 1), run("float32", 2)
    detail = {"attention": "sdpa:math", "optimizer": "fused", "compile": False, "bf16": None}
    text = jaxdp.diff(with_meta(a, kernels="fused", kernels_detail=detail), with_meta(b, kernels="mirrored")).text()
    lines = [line for line in text.splitlines() if "kernels:" in line]
    assert lines == ["note: kernels: fused (A: attention sdpa:math, optimizer fused) / mirrored (B)"], text
    one_side = jaxdp.diff(with_meta(a, kernels="fused"), b).text()  # a trace from before --kernels
    assert "note: kernels: fused (A) / unrecorded (B)" in one_side
    assert "kernels:" not in jaxdp.diff(a, b).text()  # neither says: no line
