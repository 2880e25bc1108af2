"""The honest matrix's transformers side without the matrix: the covering set holds every family, strategy,
N, dtype and optimizer; each family builds the same weights every call and maps to Flax names; a bfloat16
case computes in bfloat16 over float32 parameters; `promoted_sites` promotes while it lasts, and only then."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.mutations import hf_models, honest


@pytest.mark.quick
def test_the_hf_covering_set_holds_every_value_and_every_pair():
    cases = honest.covering(honest.HF)
    assert len(hf_models.FAMILIES) >= 8
    for dim, values in honest.HF.items():
        assert {c[dim] for c in cases} == set(values), dim
    pairs = {(c["model"], c["strategy"]) for c in cases} | {(c["model"], c["dtype"]) for c in cases}
    assert len(pairs) == len(hf_models.FAMILIES) * (len(honest.HF["strategy"]) + len(honest.HF["dtype"]))


@pytest.mark.quick
def test_each_family_names_its_trap():
    doc = hf_models.__doc__
    assert all(f"\n  {name} " in doc for name in hf_models.FAMILIES)


@pytest.mark.quick
@pytest.mark.parametrize("name", hf_models.FAMILIES)
def test_each_family_builds_the_same_weights_and_maps_to_flax_names(name):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.mutations import hf_honest
    from torch_ref import convert

    a, b = hf_models.hf_model(name, "float64"), hf_models.hf_model(name, "float64")
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert all(p.dtype == torch.float64 for p in a.parameters())
    mapped = convert.mapping(a, hf_honest.NAMES.get(name), hf_models.PREFIX[name])
    assert {n for n, _ in a.named_parameters()} <= set(mapped)


@pytest.mark.quick
def test_a_bfloat16_case_computes_in_bfloat16_over_float32_parameters():
    pytest.importorskip("transformers")
    from tests.mutations import hf_honest

    case = dict(model="opt", optimizer="adamw", strategy="single", devices=1, steps=1)
    (m16, a16), (_, a32) = (hf_honest.record(dict(case, dtype=d), 0, 1) for d in ("bfloat16", "float32"))
    assert m16["dtype"] == "bfloat16" and a16["step/1/param/final_layer_norm/scale"].dtype == np.float32
    loss16, loss32 = float(a16["step/1/loss"]), float(a32["step/1/loss"])
    assert loss16 != loss32 and abs(loss16 - loss32) < 0.05 * loss32


@pytest.mark.quick
def test_promoted_sites_compute_in_float64_inside_and_restore_on_exit():
    torch = pytest.importorskip("torch")
    gemma = pytest.importorskip("transformers.models.gemma.modeling_gemma")
    from tests.mutations import hf_honest

    norm = gemma.GemmaRMSNorm(8).double()
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(4, 8, dtype=torch.float64) * 3
    exact = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + norm.eps) * (1 + norm.weight)
    as_built = gemma.GemmaRMSNorm.forward
    with hf_honest.promoted_sites():
        assert torch.allclose(norm(x), exact, rtol=1e-15, atol=0)
        assert torch.nn.functional.softmax(x, dim=-1, dtype=torch.float32).dtype == torch.float64
    assert gemma.GemmaRMSNorm.forward is as_built
    assert (norm(x) - exact).abs().max() > 1e-10  # as built: float32


@pytest.mark.quick
def test_the_loss_is_computed_on_float32_logits_under_bf16_as_transformers_does():
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from tests.mutations import hf_honest

    logits, y = torch.randn(2, 8, 64), torch.randint(0, 64, (2, 8))
    low = hf_honest.loss_fn(SimpleNamespace(logits=logits.bfloat16()), y)
    assert low.dtype == torch.float32  # a bf16 loss is quantised to 2^-5 near 4: two ulps are 1.5% of it
    assert low == torch.nn.functional.cross_entropy(logits.bfloat16().float().flatten(0, 1), y.flatten())
    assert hf_honest.loss_fn(SimpleNamespace(logits=logits.double()), y).dtype == torch.float64


@pytest.mark.quick
def test_only_failed_selects_the_cases_a_results_file_lists_as_failed(tmp_path):
    """`--only-failed FILE`: the covering sets' cases behind the failed labels, hf and project, none else."""
    failed = ["hf-bert sgd bfloat16 N=4 torch_ref zero3~single", "mlp adam float32 N=2 accum=2 jaxdp ddp~torch_ref ddp"]
    results = tmp_path / "honest.json"
    results.write_text(json.dumps({"comparisons": [{"case": c, "ok": False} for c in failed]
                                   + [{"case": "hf-bert sgd bfloat16 N=4 torch_ref zero2~single", "ok": True}]}))
    labels = honest.failed_cases(str(results))
    hf = dict(model="bert", optimizer="sgd", dtype="bfloat16", devices=4)
    assert honest._failed(dict(hf, strategy="zero3"), labels)
    assert not honest._failed(dict(hf, strategy="zero2"), labels)
    assert not honest._failed(dict(hf, devices=3, strategy="zero3"), labels)
    mlp = dict(model="mlp", optimizer="adam", dtype="float32", devices=2)
    assert honest._failed(dict(mlp, strategy=("ddp", "ddp")), labels)
    assert not honest._failed(dict(mlp, strategy=("ddp-ring", "ddp-ring")), labels)
    assert honest.failed_cases("") is None
