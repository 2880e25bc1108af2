"""The judge's bounds from the precision census (jaxdp/judge/precision.py), on real torch runs of float64
transformers models with float32 sites (tests/mutations/precision_limits.py): ddp on 2 ranks against
single, AdamW, 3 steps.

- Negative control: Gemma's honest float64 pair fails the float64 bounds when the census is taken out of the
  metas (its norm scales' gradients are float32 sums: 4.6e-8 against 1e-12); with the census it passes, and
  the verdict names the float32 sites and the fix in one line (text and --json).
- Real bugs are still caught on the same runs: one tensor's learning rate 1.00001x (every step), gradients
  doubled at one step.
- Under `torch_ref.precision.keep_float64()` the census lists no float32 site, the float64 bounds apply and a
  1e-10 change of one tensor's gradient (its updates following it) is caught, which the census mode (gradients
  at float32's roundoff) lets pass; a 1e-15 change of its learning rate is caught in both.
"""
from __future__ import annotations

import functools

import pytest

from jaxdp.core.traces import census, trace
from jaxdp.judge import divergence, parity, precision, verdict
from tests.mutations import limits
from tests.mutations import precision_limits as P

KERNEL = "layers/0/mlp/down_proj/kernel"


@functools.cache
def world() -> dict:
    pytest.importorskip("transformers")
    from torch_ref.launch import launch

    return launch(P.run_cases, 2, timeout_s=300, pg_timeout_s=120)[0]


@functools.cache
def pair(name: str, keep: bool) -> tuple[trace.Trace, trace.Trace]:
    """(ddp on 2 ranks, single) of one case."""
    return trace.Trace(*world()[(name, keep)]), trace.Trace(*P.record(name, "single", 0, 1, keep))


def meta(run: str, *lower: str) -> dict:
    counts = {(f"m.{d}", "Norm", "rsqrt", d, "forward"): 1 for d in lower}
    return {"dtype": run, "optimizer": "adamw", census.KEY: census.summary(run, counts)}


def test_the_bounds_follow_the_lowest_site_and_never_loosen_without_one():
    f64, f32 = parity.TOLERANCES[("float64", "adam")], parity.TOLERANCES[("float32", "adam")]
    assert parity.tolerance(meta("float64")) == f64  # a census with no lower site: float64's bounds
    wide = parity.tolerance(meta("float64", "float32"))
    assert (wide.loss, wide.grad) == (f32.loss, f32.grad)
    assert (wide.param, wide.update, wide.step_update, wide.elementwise) == (
        f64.param, f64.update, f64.step_update, f64.elementwise)
    assert parity.tolerance(meta("float32", "bfloat16")).grad == parity.TOLERANCES[("bfloat16", "adam")].grad
    assert precision.roundoff_dtype(meta("float64"), meta("float64", "float32", "bfloat16")) == "bfloat16"
    assert precision.unit("float64", meta("float64"), meta("float64", "float32")) == 2.0 ** -24
    assert precision.unit("float64", {}, meta("float64")) == 2.0 ** -53
    assert precision.line(meta("float64"), {}) == "" and precision.to_json({}, {}) is None
    one = precision.line(meta("float64", "float32"), meta("float64"))
    assert one.startswith("lower precision in a float64 run: A: 1 float32 sites (Norm at m.float32 (rsqrt))")


def without_census(t: trace.Trace) -> trace.Trace:
    return trace.Trace({k: v for k, v in t.meta.items() if k != "precision"}, t.arrays)


def test_an_honest_float64_run_with_float32_sites_fails_the_float64_bounds_without_its_census():
    a, b = pair("gemma", False)
    report = divergence.compare(without_census(a), without_census(b))
    assert not report.ok
    assert any(f.startswith("grad ") and "scale" in f for f in report.failures), report.failures


def test_with_its_census_it_passes_and_the_verdict_names_the_sites_and_the_fix():
    a, b = pair("gemma", False)
    v = verdict.diff(a, b)
    assert v.ok, v.text()
    line = [n for n in v.notes if n.startswith("lower precision")]
    assert len(line) == 1 and "GemmaRMSNorm at model.layers.0.input_layernorm" in line[0]
    assert "keep_float64()" in line[0] and "float32's roundoff" in line[0]
    doc = v.to_json()["precision"]
    assert doc["judged_at"] == "float32" and doc["a"]["lowest"] == "float32" and doc["line"] == line[0]
    assert v.bounds.measures["grad"] == 1e-5 and v.bounds.measures["param"] == 1e-12


def test_llama_with_float32_sites_passes():
    a, b = pair("llama", False)
    assert a.meta["precision"]["total"] > 0
    assert divergence.compare(a, b).ok


@pytest.mark.parametrize("bug", ["lr 1.00001x", "gradients doubled"])
def test_real_bugs_are_caught_on_the_same_runs(bug):
    a, b = pair("gemma", False)
    if bug == "lr 1.00001x":
        broken, where = limits.with_lr(a, KERNEL, 1e-5), (1, "param", KERNEL)
    else:
        broken, where = limits.scaled_grad(a, 2, KERNEL, 1.0), (2, "grad", KERNEL)
    report = divergence.compare(broken, b)
    assert not report.ok
    assert (report.first.step, report.first.field, report.first.name) == where


def test_keep_float64_gives_the_tight_float64_check():
    a, b = pair("gemma", True)
    assert a.meta["precision"]["lowest"] == "float64" and a.meta["precision"]["sites"] == []
    assert parity.judge(a, b).tol.grad == 1e-12
    assert divergence.compare(a, b).ok
    assert not divergence.compare(P.wrong_grad(a, 2, KERNEL, 1e-10), b).ok
    census_a, census_b = pair("gemma", False)  # the same gradient change is below float32's roundoff
    assert divergence.compare(P.wrong_grad(census_a, 2, KERNEL, 1e-10), census_b).ok
    for x, y in ((a, b), (census_a, census_b)):  # an optimizer's bug: the tight bound in both
        assert not divergence.compare(limits.with_lr(x, KERNEL, 1e-14), y).ok


def test_a_lower_dtype_in_the_data_parallel_code_is_no_allowance_and_is_named():
    """A bf16 cast before the gradients' all-reduce (phase `outside`, or a backward op no module's forward made)
    is what the bf16-reduction bug looks like: the bounds stay the run's, and the line names it; a float32 site in
    the model's forward still sets float32's (the catalogue's bf16-reduction case in torch, float64 and float32,
    was missed while every lower op counted)."""
    from jaxdp.judge import precision as judge_precision

    keys = ("module", "class", "op", "dtype", "phase")

    def meta(*sites):
        rows = [dict(zip(keys, s, strict=True), count=1) for s in sites]
        return {"dtype": "float64", "precision": {"dtype": "float64", "lowest": "bfloat16", "total": len(sites),
                                                  "sites": rows}}

    reduction = meta(("", "", "aten._to_copy", "bfloat16", "outside"), ("backward", "", "aten.add", "bfloat16",
                                                                        "backward"))
    assert judge_precision.roundoff_dtype(reduction) is None
    assert "outside the model" in judge_precision.line(reduction, reduction)
    model = meta(("model.norm", "LlamaRMSNorm", "aten.mean", "float32", "forward"))
    assert judge_precision.roundoff_dtype(model, reduction) == "float32"
