"""zero3's default units with shared parameters (torch_ref/models/units.py): Hugging Face's GPT-2
(its head tied to `wte`) and two blocks sharing one weight train under zero3 on 2 ranks as under
single (every step's loss, gradient and parameters, float64, 1e-10 as tests/torch_ref/test_torch_api.py argues);
the default units are the decoder layers; units= that split a shared parameter are one line before
any step. The runs are in the suite's shared torch world of 2 ranks (tests/torch_shared_ranks.py)."""
from __future__ import annotations

import pytest
from torch import nn

from tests.torch_helpers import world
from tests.torch_ref.test_torch_api import TOL, worst_error
from tests.torch_shared_ranks import MODELS, hf_gpt2, shared_blocks
from torch_ref.models import gpt2 as torch_gpt2
from torch_ref.models import units
from torch_ref.strategies.zero import zero3


def shared_results(name: str) -> dict:
    per_rank = [r["shared"] for r in world(2)["api"]]
    assert name in per_rank[0], f"the 2-rank world ran no {name!r} case"  # transformers present: it must run
    return per_rank[0][name]


@pytest.mark.torch_jobs(("api", 2))
@pytest.mark.parametrize("name", MODELS)
def test_zero3_with_shared_parameters_equals_single(name):
    if name == "hf-gpt2":
        pytest.importorskip("transformers")
    got = shared_results(name)
    error, key = worst_error(got["zero3"], got["single"])
    assert error <= TOL, f"{name}: {key} off by {error:.2e}"
    if name == "hf-gpt2":  # the Recorder's strip_prefix: jaxdp's GPT-2 names, the tied head once
        assert "init/wte/embedding" in got["zero3"] and not any("lm_head" in k for k in got["zero3"])


def test_default_units_of_model_library_models_are_their_decoder_layers():
    transformers = pytest.importorskip("transformers")
    model = hf_gpt2()
    assert zero3.units_of(model) == [[model.transformer.h[0]], [model.transformer.h[1]]]
    children = [[child] for child in model.children()]  # the old default: FSDP2 refuses it at the first step
    assert any(len(g) > 1 for g in units.groups_of(model, children).values())
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, hidden_size=8, intermediate_size=16,
        vocab_size=16, max_position_embeddings=8))
    assert zero3.units_of(llama) == [[layer] for layer in llama.model.layers]
    bert = transformers.BertModel(transformers.BertConfig(vocab_size=16, hidden_size=8, num_hidden_layers=2,
                                                          num_attention_heads=2, intermediate_size=16))
    assert zero3.units_of(bert) == [[layer] for layer in bert.encoder.layer]


def test_default_units_leave_shared_parameters_to_the_root():
    net = shared_blocks()
    got = zero3.units_of(net)
    assert got == [[net.blocks[0].norm], [net.blocks[1].norm]]  # each block without the fc sharing a weight
    root = len(got)
    assert units.groups_of(net, got)[id(net.blocks[0].fc.weight)] == {root}
    gpt = torch_gpt2.GPT2(vocab=8, seq_len=4, n_layer=2, n_head=2, d_model=4)
    assert zero3.units_of(gpt) == torch_gpt2.fsdp_units(gpt)  # jaxdp's own models: their units as before


def test_units_that_split_a_shared_parameter_are_one_line():
    net = shared_blocks()
    with pytest.raises(ValueError) as e:
        zero3.apply_fsdp(net, units=[[net.blocks[0]], [net.blocks[1]]])  # before any process group is used
    message = str(e.value)
    assert "\n" not in message and message.startswith(
        "units= splits the shared parameter 'blocks.0.fc.weight' (also 'blocks.1.fc.weight') between units[0] "
        "and units[1]: FSDP2 manages a shared parameter in one group"), message
    with pytest.raises(ValueError, match=r"'blocks.0.fc.weight' .* between units\[0\] and the root"):
        zero3.apply_fsdp(net, units=[[net.blocks[0]]])
    units.check_shared(net, [[net.blocks]])  # one unit holding every use: fine
    units.check_shared(net, [[nn.Identity()]])  # none: the root's
