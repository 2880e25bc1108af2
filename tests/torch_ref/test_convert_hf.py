"""torch_ref.convert on Hugging Face transformers' models as they are (tiny configs, nothing downloaded):
GPT-2 (Conv1D, the head tied to `wte`) converts with `strip_prefix='transformer.'` to exactly
`jaxdp.models.GPT2`'s names and shapes and computes its logits (float64, 1e-12); Llama (LlamaRMSNorm,
the non-persistent rotary buffers) and BERT (non-persistent `position_ids` / `token_type_ids`) convert
with no map. torch_ref never imports transformers: its layers are matched by class name."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxdp.models import gpt2 as jax_gpt2
from torch_ref import convert

transformers = pytest.importorskip("transformers")

VOCAB, SEQ, LAYERS, HEADS, D = 96, 16, 2, 2, 64


def hf_gpt2():
    config = transformers.GPT2Config(n_layer=LAYERS, n_head=HEADS, n_embd=D, n_positions=SEQ, vocab_size=VOCAB,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                                     attn_implementation="eager")
    assert config.activation_function == "gelu_new" and config.layer_norm_epsilon == jax_gpt2.LN_EPS  # tanh GELU
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).double().eval()


@functools.cache
def jax_model():
    return jax_gpt2.GPT2(vocab=VOCAB, seq_len=SEQ, n_layer=LAYERS, n_head=HEADS, d_model=D,
                         param_dtype=jnp.float64, dtype=jnp.float64, rngs=nnx.Rngs(3))


def shapes(tree) -> dict:
    return {name: tuple(np.shape(leaf)) for name, leaf in convert.flatten(tree).items()}


def test_hf_gpt2_converts_to_jaxdp_gpt2_names_and_shapes():
    model = hf_gpt2()
    want = shapes(nnx.to_pure_dict(nnx.state(jax_model())))  # all its state: parameters only
    assert shapes(convert.to_flax(model, strip_prefix="transformer.")) == want
    names = convert.flax_names(model, strip_prefix="transformer.")
    assert "lm_head.weight" not in names and names["transformer.wte.weight"] == "wte/embedding"  # tied: once
    assert names["transformer.h.1.attn.c_attn.weight"] == "h/1/attn/c_attn/kernel"
    assert convert.flax_names(model)["transformer.ln_f.weight"] == "transformer/ln_f/scale"  # no prefix: kept


def logits_error(names=None) -> tuple[float, float]:
    """Max |HF - jaxdp| of the logits after loading jaxdp's GPT-2 parameters (moved off their initial
    zeros and ones) into the HF model, and max |logits|."""
    flax_model = jax_model()
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda a: np.asarray(a) + 0.05 * rng.standard_normal(a.shape),
                          nnx.to_pure_dict(nnx.state(flax_model, nnx.Param)))
    flax_model = nnx.merge(nnx.graphdef(flax_model), nnx.state(flax_model))  # a copy: the cached one is kept
    nnx.update(flax_model, jax.tree.map(jnp.asarray, params))
    model = convert.load_flax(hf_gpt2(), params, names, strip_prefix="transformer.")
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied, loaded once
    back = convert.to_flax(model, names, strip_prefix="transformer.")
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params), strict=True))
    tokens = rng.integers(0, VOCAB, (3, SEQ))
    with torch.no_grad():
        got = model(torch.from_numpy(tokens)).logits.numpy()
    want = np.asarray(flax_model(jnp.asarray(tokens)))
    return float(np.max(np.abs(got - want))), float(np.max(np.abs(want)))


def test_hf_gpt2_loaded_from_jaxdp_gives_jaxdp_logits():
    error, scale = logits_error()
    assert error < 1e-12 and scale > 0.1, (error, scale)


def test_a_wrong_layout_is_caught(monkeypatch):
    """The checks can fail: a square Conv1D weight (c_proj) transposed changes the logits; Conv1D's
    weights transposed as a Linear's are refused by shape, every one named."""
    name = "transformer.h.0.attn.c_proj.weight"
    assert logits_error({name: ("h/0/attn/c_proj/kernel", (1, 0))})[0] > 1e-3
    monkeypatch.setitem(convert.NAMED_RULES, "Conv1D", {**convert.NAMED_RULES["Conv1D"],
                                                        "weight": ("kernel", lambda t: (1, 0))})
    params = nnx.to_pure_dict(nnx.state(jax_model(), nnx.Param))
    with pytest.raises(convert.ConvertError, match=r"^6 tensor.*Flax 'h/0/attn/c_attn/kernel' \(192, 64\)"):
        convert.load_flax(hf_gpt2(), params, strip_prefix="transformer.")


def test_llama_converts_with_no_map():
    config = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=64,
                                      intermediate_size=128, vocab_size=96, max_position_embeddings=16)
    model = transformers.LlamaForCausalLM(config)
    assert type(model.model.norm).__name__ == "LlamaRMSNorm" and not isinstance(model.model.norm, torch.nn.RMSNorm)
    names = convert.flax_names(model, strip_prefix="model.")
    assert len(names) == len(list(model.parameters())) and not any("inv_freq" in n for n in names)
    for torch_name, flax_name in [("model.embed_tokens.weight", "embed_tokens/embedding"),
                                  ("model.layers.0.self_attn.q_proj.weight", "layers/0/self_attn/q_proj/kernel"),
                                  ("model.layers.0.input_layernorm.weight", "layers/0/input_layernorm/scale"),
                                  ("model.norm.weight", "norm/scale"), ("lm_head.weight", "lm_head/kernel")]:
        assert names[torch_name] == flax_name
    flat = convert.flatten(convert.to_flax(model, strip_prefix="model."))
    assert flat["layers/1/self_attn/k_proj/kernel"].shape == (64, 32)
    back = convert.load_flax(transformers.LlamaForCausalLM(config), flat, strip_prefix="model.")
    assert all(torch.equal(a, b) for a, b in zip(back.parameters(), model.parameters(), strict=True))


def test_bert_converts_and_its_id_buffers_are_not_state():
    config = transformers.BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=16)
    model = transformers.BertModel(config)
    names = convert.flax_names(model)
    assert len(names) == len(list(model.parameters()))  # position_ids, token_type_ids: non-persistent buffers
    assert names["embeddings.LayerNorm.weight"] == "embeddings/LayerNorm/scale"
    assert names["encoder.layer.1.intermediate.dense.weight"] == "encoder/layer/1/intermediate/dense/kernel"
    buffers = dict(model.named_buffers())
    assert convert.tensors_to_flax(model, buffers) == {}  # dropped, not an error
    named = convert.flax_names(model, names={"embeddings.position_ids": "pos_ids"})  # converted only if named
    assert named["embeddings.position_ids"] == "pos_ids"


def test_bert_masked_lm_tied_decoder_bias_is_named_by_the_layer_that_uses_it():
    """BertForMaskedLM ties the decoder's weight to the word embedding and its bias to the head's own
    `cls.predictions.bias` (a parameter of a module without a rule, listed first): the bias is named
    by its first path a rule maps, the decoder's, and a load keeps both ties."""
    config = transformers.BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64)
    model = transformers.BertForMaskedLM(config)
    names = convert.flax_names(model, strip_prefix="bert.")
    assert names["cls.predictions.bias"] == "cls/predictions/decoder/bias"
    assert "cls.predictions.decoder.weight" not in names  # the word embedding, named once
    fresh = transformers.BertForMaskedLM(config)
    convert.load_flax(fresh, convert.to_flax(model, strip_prefix="bert."), strip_prefix="bert.")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True))
    assert fresh.cls.predictions.decoder.bias is fresh.cls.predictions.bias
