"""torch_ref/precision.py: the census of a float64 transformers model's forward and backward finds its float32
sites, by module and class (LlamaRMSNorm's upcast, the eager softmax; GPT-NeoX's softmax and rotary angles),
none under `keep_float64()` (whose loss is then the one of transformers' float32 sites promoted by hand,
hf_honest.promoted_sites's functions), none in a model that has none (GPT-2); and `torch_ref.trace.Recorder` puts
the first step's census into its meta (AdamW's float32 step counter not a site)."""
from __future__ import annotations

import functools

import pytest
import torch

import torch_ref
from tests.mutations import hf_honest
from torch_ref import precision


class Upcast(torch.nn.Module):
    """A float64 layer that normalises in float32, as transformers' RMSNorm does."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, x):
        h = self.fc(x).float()
        return (h * torch.rsqrt(h.square().mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


def test_a_float32_upcast_in_a_plain_module_is_a_site_and_keep_float64_removes_it():
    model, x = Upcast(), torch.ones(2, 4, dtype=torch.float64)
    c = precision.census(model, lambda: model(x).sum().backward())
    sites = {(s["module"], s["class"], s["op"], s["phase"]) for s in c["sites"]}
    assert {("", "Upcast", "rsqrt", "forward"), ("", "Upcast", "_to_copy", "forward"),
            ("", "Upcast", "pow", "backward")} <= sites  # the root module is "" by its qualified name
    assert not any(s["class"] == "Linear" for s in c["sites"])  # fc computes in float64
    with precision.keep_float64():
        kept = precision.census(model, lambda: model(x).sum().backward())
        assert torch.get_default_dtype() == torch.float64
    assert (kept["lowest"], kept["sites"]) == ("float64", [])
    assert torch.get_default_dtype() == torch.float32


def step(model, k: int = 1):
    x, y = (torch.from_numpy(v) for v in hf_honest.batch("llama", k, "float64"))
    loss = hf_honest.loss_fn(model(x), y)
    loss.backward()
    return float(loss)


@functools.cache
def census(name: str, keep: bool = False) -> dict:
    pytest.importorskip("transformers")
    model = hf_honest.hf_model(name, "float64")
    with precision.keep_float64() if keep else precision.contextlib.nullcontext():
        return precision.census(model, lambda: step(model))


def classes(c: dict, phase: str | None = None) -> set:
    return {(s["class"], s["op"]) for s in c["sites"] if phase in (None, s["phase"])}


def test_llama_float32_sites_by_module():
    c = census("llama")
    assert (c["dtype"], c["lowest"]) == ("float64", "float32")
    forward = classes(c, "forward")
    assert {("LlamaRMSNorm", "rsqrt"), ("LlamaAttention", "_softmax"), ("LlamaRotaryEmbedding", "_to_copy")} <= forward
    assert ("LlamaAttention", "_softmax_backward_data") in classes(c, "backward")  # backward: the module that made it
    norms = {s["module"] for s in c["sites"] if s["class"] == "LlamaRMSNorm"}
    assert "model.layers.0.input_layernorm" in norms and "model.norm" in norms
    assert c["total"] >= len(c["sites"]) and c["ops"] >= c["total"]


def test_neox_float32_sites():
    assert {("GPTNeoXAttention", "_softmax"), ("GPTNeoXRotaryEmbedding", "mul")} <= classes(census("neox"), "forward")


@pytest.mark.parametrize("name", ["llama", "neox"])
def test_keep_float64_leaves_no_float32_site(name):
    c = census(name, keep=True)
    assert (c["lowest"], c["sites"], c["total"]) == ("float64", [], 0)


def test_a_float64_model_without_float32_sites_has_none():
    assert census("gpt2")["sites"] == []


def test_keep_float64_computes_what_promoting_the_sites_by_hand_computes(monkeypatch):
    pytest.importorskip("transformers")
    model = hf_honest.hf_model("llama", "float64")
    with precision.keep_float64():
        kept = step(model)
    from transformers.models.llama import modeling_llama as llama

    monkeypatch.setattr(llama.LlamaRMSNorm, "forward", hf_honest.rms_norm_in_dtype)
    monkeypatch.setattr(llama.LlamaRotaryEmbedding, "forward", hf_honest.rotary_in_float64)
    softmax = torch.nn.functional.softmax
    monkeypatch.setattr(torch.nn.functional, "softmax", lambda x, dim=None, dtype=None, **kw: softmax(x, dim=dim))
    promoted, plain = step(hf_honest.hf_model("llama", "float64")), None
    monkeypatch.undo()
    plain = step(hf_honest.hf_model("llama", "float64"))
    assert abs(kept - promoted) <= 1e-14 * abs(promoted) < abs(plain - promoted)
    assert torch.get_default_dtype() == torch.float32  # restored


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_the_recorder_puts_the_first_steps_census_into_meta(name):
    """AdamW included: its float32 `step` counter (a float64 model, float32 default dtype) is no site."""
    pytest.importorskip("transformers")
    model, opt = torch_ref.parallelize(hf_honest.hf_model(name, "float64"), strategy="single",
                                       optimizer=lambda ps: torch.optim.AdamW(ps, lr=0.01))
    with torch_ref.trace.Recorder(None, {"dtype": "float64"}, model, strip_prefix=hf_honest.PREFIX[name],
                                  optimizer=opt) as rec:
        rec.init()
        for k in (1, 2):
            x, y = (torch.from_numpy(v) for v in hf_honest.batch(name, k, "float64"))
            rec.step(k, torch_ref.train_step(model, opt, x, y, hf_honest.loss_fn))
    got = rec.meta["precision"]
    if name == "llama":
        assert got["dtype"] == "float64" and ("LlamaRMSNorm", "rsqrt") in classes(got, "forward")
    else:
        assert (got["lowest"], got["sites"]) == ("float64", [])
    assert rec.census is None  # closed at the first step
