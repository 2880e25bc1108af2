"""`kernels="fused"` (torch_ref/models/attention.py): SDPA's causal attention equals the mirrored one to float64
roundoff in gpt, gpt2 and llama (grouped-query included: query head j reads kv head j // (heads / kv_heads)),
outputs and gradients."""
from __future__ import annotations

import pytest
import torch

from torch_ref.models import attention
from torch_ref.models.gpt import GPT
from torch_ref.models.gpt2 import GPT2
from torch_ref.models.llama import Llama

pytestmark = pytest.mark.quick
SIZE = dict(vocab=37, seq_len=12, n_layer=2, d_model=24)
MODELS = {
    "gpt": lambda kernels: GPT(n_head=3, kernels=kernels, **SIZE),
    "gpt2": lambda kernels: GPT2(n_head=3, kernels=kernels, **SIZE),
    "llama-gqa": lambda kernels: Llama(n_head=6, n_kv_head=2, d_ff=40, kernels=kernels, **SIZE),
}


def outputs_and_grads(model, tokens):
    out = model(tokens)
    out.square().mean().backward()
    return out.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("name", MODELS)
def test_fused_attention_equals_the_mirrored_one_in_float64(name, monkeypatch):
    """Each layer calls `attention.fused` under kernels='fused' (never under mirrored), and the results agree."""
    calls = []
    monkeypatch.setattr(attention, "fused", lambda *a, f=attention.fused: calls.append(1) or f(*a))
    torch.manual_seed(0)
    mirrored = MODELS[name]("mirrored").double()
    fused = MODELS[name]("fused").double()
    fused.load_state_dict(mirrored.state_dict())
    tokens = torch.randint(0, SIZE["vocab"], (3, SIZE["seq_len"]))
    out_m, grads_m = outputs_and_grads(mirrored, tokens)
    assert not calls
    out_f, grads_f = outputs_and_grads(fused, tokens)
    assert len(calls) == SIZE["n_layer"]
    assert (out_f - out_m).abs().max() <= 1e-12 * out_m.abs().max()
    for param, g in grads_m.items():
        assert (grads_f[param] - g).abs().max() <= 1e-12 * g.abs().max() + 1e-300, param


def test_grouped_query_heads_read_their_own_kv_head():
    """The check above can fail: the other mapping (query head j -> kv head j % kv_heads, a tiled repeat)
    moves the output far beyond roundoff."""
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 5, 6, 4, dtype=torch.float64), *torch.randn(2, 2, 5, 2, 4, dtype=torch.float64)
    by_group = attention.fused(q, k, v)
    rep = 3  # heads / kv_heads
    expected = attention.fused(q, k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2))
    tiled = attention.fused(q, k.repeat(1, 1, rep, 1), v.repeat(1, 1, rep, 1))
    assert (by_group - expected).abs().max() < 1e-14
    assert (by_group - tiled).abs().max() > 1e-2


def test_unknown_kernels_is_one_line():
    with pytest.raises(ValueError, match=r"^unknown kernels 'fast'; valid: mirrored, fused$"):
        GPT2(n_head=3, kernels="fast", **SIZE)
