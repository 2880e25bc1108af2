"""`--model llama`: the architecture against transformers' own `LlamaForCausalLM` (weights copied by
name), jaxdp's Llama against its torch twin (logits and gradients, float64, 1e-12), the names and
FSDP units, the flags and their validation, and the parameter count formula against the models.
Strategy parity (both frameworks against `single`, and across) is in parity_tests (cases.LLAMA).

transformers in float64 is not a float64 model: its RMSNorm normalises in float32, its eager softmax
runs in float32 and its rotary cos/sin come from float32 angles, whatever the model's dtype. Each of
those 3L + 2 sites (2L + 1 norms, L softmaxes, one rotary table) rounds a tensor to float32, a
relative error of at most u = 2^-24; at initialisation every site's gain to the logits is about one
(the residual stream is normalised before each use), so |Δlogits| <= (3L + 2) u max|logits| to first
order; the test allows 4x that (here L = 2: 4.2e-7; measured 2.4e-8). The proof that nothing else
differs: with those three sites promoted to float64 (monkeypatched) the two agree to 1e-12 (measured
~2e-16). float32 against float32: every operation rounds, allowed 4x more (1.6e-6; measured 4.5e-8).
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxdp import models
from jaxdp.core.run import argv, config, data
from jaxdp.core.run.config import ConfigError, RunConfig
from jaxdp.harness.report import references
from jaxdp.models import llama

U32 = 2.0 ** -24
DIMS = dict(vocab=19, seq_len=8, n_layer=2, n_head=4, n_kv_head=2, d_model=16, d_ff=24)
SMALL = RunConfig(model="llama", data="text", n_layer=2, n_head=4, n_kv_head=2, d_model=16, d_ff=24, seq_len=8,
                  strategy="single", devices=1, batch_size=3)


def problem(dtype=jnp.float64, **changes):
    model = llama.Llama(**{**DIMS, **changes}, param_dtype=dtype, dtype=dtype, rngs=nnx.Rngs(0))
    return models.from_module(model, models.cross_entropy)


def tokens(shape=(3, 8), vocab=19, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, shape)


def hf_name(torch_name: str) -> str:
    """transformers' `model.layers.0.self_attn.q_proj.weight` -> `layers/0/self_attn/q_proj/kernel`."""
    path = torch_name.removeprefix("model.").removesuffix(".weight").replace(".", "/")
    return f"{path}/{'embedding' if path == 'embed_tokens' else 'scale' if path.endswith('norm') else 'kernel'}"


def hf_logits(params, x, torch_dtype, heads=None):
    """transformers' LlamaForCausalLM (eager attention) with our parameters copied in by name; `heads`
    permutes the query heads (q_proj's rows and o_proj's columns together)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.LlamaConfig(
        vocab_size=DIMS["vocab"], hidden_size=DIMS["d_model"], intermediate_size=DIMS["d_ff"],
        num_hidden_layers=DIMS["n_layer"], num_attention_heads=DIMS["n_head"], num_key_value_heads=DIMS["n_kv_head"],
        max_position_embeddings=DIMS["seq_len"], attn_implementation="eager")
    assert (hf_cfg.rms_norm_eps, hf_cfg.rope_parameters["rope_theta"], hf_cfg.tie_word_embeddings) == (1e-6, 1e4, False)
    hf = transformers.LlamaForCausalLM(hf_cfg).to(torch_dtype).eval()
    flat = {k: np.asarray(v) for k, v in models.flat_names(params).items()}
    hd = DIMS["d_model"] // DIMS["n_head"]
    with torch.no_grad():
        for name, p in hf.named_parameters():
            a = flat.pop(hf_name(name))
            a = a.T if a.ndim == 2 and "embed" not in name else a
            if heads is not None and "q_proj" in name:
                a = a.reshape(-1, hd, a.shape[1])[heads].reshape(a.shape)
            if heads is not None and "o_proj" in name:
                a = a.reshape(a.shape[0], -1, hd)[:, heads].reshape(a.shape)
            p.copy_(torch.from_numpy(np.array(a)))
        assert not flat, f"not in transformers' Llama: {sorted(flat)}"
        return hf(torch.from_numpy(x)).logits.numpy()


@pytest.fixture
def hf_in_float64(monkeypatch):
    """transformers' three float32 sites promoted to float64 (its RMSNorm, rotary angles, softmax)."""
    torch = pytest.importorskip("torch")
    ml = pytest.importorskip("transformers.models.llama.modeling_llama")
    from tests.mutations import hf_honest

    softmax = torch.nn.functional.softmax
    monkeypatch.setattr(ml.LlamaRMSNorm, "forward", hf_honest.rms_norm_in_dtype)
    monkeypatch.setattr(ml.LlamaRotaryEmbedding, "forward", hf_honest.rotary_in_float64)
    monkeypatch.setattr(torch.nn.functional, "softmax", lambda x, dim=None, dtype=None, **kw: softmax(x, dim=dim))


def ours_and_hf(dtype, torch_dtype, **hf_kw):
    p, x = problem(dtype), tokens()
    return np.asarray(jax.jit(p.apply)(p.params, x)), hf_logits(p.params, x, torch_dtype, **hf_kw)


# ---- the architecture against transformers --------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_logits_equal_transformers_within_the_derived_bound(dtype):
    torch = pytest.importorskip("torch")
    ours, hf = ours_and_hf(getattr(jnp, dtype), getattr(torch, dtype))
    bound = (4 if dtype == "float64" else 16) * (3 * DIMS["n_layer"] + 2) * U32 * np.abs(ours).max()
    err = np.abs(ours - hf).max()
    print(f"jaxdp vs transformers, {dtype}: max |dlogits| {err:.3g} (bound {bound:.3g})")
    assert err <= bound and err > 0


def test_logits_equal_transformers_to_1e_12_with_its_float32_sites_in_float64(hf_in_float64):
    torch = pytest.importorskip("torch")
    ours, hf = ours_and_hf(jnp.float64, torch.float64)
    assert np.abs(ours - hf).max() <= 1e-12 * np.abs(ours).max()


@pytest.mark.parametrize("bug", ["interleaved rotary", "eps 1e-5", "query heads permuted"])
def test_the_transformers_check_sees_a_wrong_architecture(bug, hf_in_float64, monkeypatch):
    """Negative controls: rotary on interleaved pairs (GPT-J's convention), RMSNorm eps 1e-5, or query
    head h reading kv head h % n_kv_head instead of h // (n_head / n_kv_head) (the same as
    permuting the query heads, which with n_kv_head = n_head would be an exact symmetry)."""
    torch = pytest.importorskip("torch")
    heads = None
    if bug == "interleaved rotary":
        pairs = lambda x: jnp.stack([-x[..., 1::2], x[..., ::2]], -1).reshape(x.shape)  # noqa: E731
        monkeypatch.setattr(llama, "rotate_half", pairs)
    elif bug == "eps 1e-5":
        monkeypatch.setattr(llama, "_rms_norm", lambda d, eps, **kw: nnx.RMSNorm(d, epsilon=1e-5, **kw))
    else:
        heads = [0, 2, 1, 3]  # h -> kv h % 2 is h // 2 after swapping heads 1 and 2
    ours, hf = ours_and_hf(jnp.float64, torch.float64, heads=heads)
    derived = 4 * (3 * DIMS["n_layer"] + 2) * U32 * np.abs(ours).max()  # the float64 test's bound
    assert np.abs(ours - hf).max() > max(1e-4 * np.abs(ours).max(), 50 * derived)


def test_names_are_transformers_less_its_model_prefix():
    names = list(models.definition_order(llama.Llama(**DIMS, param_dtype=jnp.float64, dtype=jnp.float64,
                                                     rngs=nnx.Rngs(0))))
    assert names[:2] == ["embed_tokens/embedding", "layers/0/input_layernorm/scale"]
    assert names[-2:] == ["norm/scale", "lm_head/kernel"]
    layer = {n.split("/", 2)[2] for n in names if n.startswith("layers/1/")}
    assert layer == {"input_layernorm/scale", "post_attention_layernorm/scale",
                     *(f"self_attn/{p}_proj/kernel" for p in "qkvo"),
                     *(f"mlp/{p}_proj/kernel" for p in ("gate", "up", "down"))}


# ---- jaxdp against its torch twin ------------------------------------------------------------------
def twin_logits_and_grads(p, x, y):
    torch = pytest.importorskip("torch")
    from torch_ref import convert
    from torch_ref.models import llama as torch_llama

    model = torch_llama.Llama(**DIMS).double()
    convert.load_flax(model, {k: np.asarray(v) for k, v in models.flat_names(p.params).items()})
    logits = model(torch.from_numpy(x))
    torch.nn.functional.cross_entropy(logits.reshape(-1, DIMS["vocab"]), torch.from_numpy(y).reshape(-1)).backward()
    grads = convert.tensors_to_flax(model, {n: t.grad for n, t in model.named_parameters()})
    return logits.detach().numpy(), grads


def twin_errors():
    p, x, y = problem(), tokens(), tokens(seed=1)
    logits = np.asarray(jax.jit(p.apply)(p.params, x))
    grads = {k: np.asarray(v) for k, v in models.flat_names(jax.jit(jax.grad(p.loss_fn))(p.params, x, y)).items()}
    t_logits, t_grads = twin_logits_and_grads(p, x, y)
    assert t_grads.keys() == grads.keys()
    rel = max(np.abs(grads[k] - t_grads[k]).max() / np.abs(grads[k]).max() for k in grads)
    return np.abs(logits - t_logits).max(), rel


def test_jaxdp_equals_its_torch_twin_in_float64():
    d_logits, d_grad = twin_errors()
    print(f"jaxdp vs torch_ref Llama, float64: max |dlogits| {d_logits:.3g}, max relative |dgrad| {d_grad:.3g}")
    assert d_logits <= 1e-12 and d_grad <= 1e-12


def test_the_twin_check_sees_a_twin_with_float32_rotary(monkeypatch):
    """Negative control: the torch twin's rotary tables in float32 (transformers' choice) are caught."""
    torch = pytest.importorskip("torch")
    from torch_ref.models import llama as torch_llama

    rotary = torch_llama.rotary
    monkeypatch.setattr(torch_llama, "rotary", lambda t, hd, dtype, device=None, theta=torch_llama.ROPE_THETA:
                        tuple(a.double() for a in rotary(t, hd, torch.float32, device, theta)))
    d_logits, d_grad = twin_errors()
    assert d_logits > 1e-9 or d_grad > 1e-9


def test_units_are_the_embedding_each_layer_and_the_head_in_both_frameworks():
    p = problem()
    assert [(u.name, u.paths) for u in p.units] == [
        ("embed", (("embed_tokens",),)), ("layers/0", (("layers", 0),)), ("layers/1", (("layers", 1),)),
        ("head", (("norm",), ("lm_head",)))]
    pytest.importorskip("torch")
    from torch_ref.models import llama as torch_llama
    from torch_ref.strategies.zero import zero3

    model = torch_llama.Llama(**DIMS)
    named = {id(m): n for n, m in model.named_modules()}
    assert [[named[id(m)] for m in u] for u in zero3.units_of(model)] == \
        [["embed_tokens"], ["layers.0"], ["layers.1"], ["norm", "lm_head"]]


# ---- flags -------------------------------------------------------------------------------------------
def test_defaults_are_meta_and_transformers_rules():
    assert config.llama_d_ff(4096) == 11008 and config.llama_d_ff(32) == 256 and config.llama_d_ff(768) == 2048
    cfg = RunConfig(model="llama", data="text", n_head=4, d_model=64).validate()
    assert (cfg.kv_heads(), cfg.ffn_width()) == (4, 256)
    parser = argv.Parser()
    argv.add_run_arguments(parser)
    argv.add_strategies(parser, "ddp", config.ALL_STRATEGIES, "strategy")
    args = parser.parse_args("--model llama --data tokens --n-kv-head 2 --d-ff 96 --n-head 4 --strategy zero3".split())
    for framework in ("jax", "torch"):
        (cfg,) = argv.configs(args, framework)
        assert (cfg.model, cfg.kv_heads(), cfg.ffn_width()) == ("llama", 2, 96)


@pytest.mark.parametrize("change,message", [
    (dict(n_kv_head=3), "--n-kv-head 3 must divide --n-head 4"),
    (dict(d_model=12, n_head=4, n_kv_head=0), "head dimension --d-model / --n-head = 3 must be even"),
    (dict(d_model=18), "--d-model 18 must divide by --n-head 4"),
    (dict(d_ff=-1), "--d-ff -1: must be >= 0; e.g. --d-ff 0"),
    (dict(n_kv_head=-2), "--n-kv-head -2: must be >= 0"),
    (dict(data="digits"), "model 'llama' trains on tokens: use --data text or --data tokens"),
    (dict(model="gpt2"), r"--n-kv-head is for --model llama \(got --model gpt2\)"),
    (dict(model="gpt", n_kv_head=0), r"--d-ff is for --model llama \(got --model gpt\)"),
])
def test_bad_llama_flags_name_the_fix(change, message):
    with pytest.raises(ConfigError, match=message):
        SMALL.replace(**change).validate()


# ---- accounting ----------------------------------------------------------------------------------------
def count(model) -> int:
    return sum(math.prod(p.shape) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))


@pytest.mark.parametrize("cfg", [SMALL, SMALL.replace(n_kv_head=0, d_ff=0), SMALL.replace(model="gpt2", n_kv_head=0,
                                                                                        d_ff=0)],
                         ids=["llama-gqa", "llama-defaults", "gpt2"])
def test_parameter_count_formula_equals_the_models(cfg):
    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    shape = references.of_run(cfg, dataset.n_classes)
    assert references.params(shape) == count(models.build(cfg, dataset))
    assert references.flops_per_token(shape) == 6 * references.params(shape) + 12 * cfg.n_layer * cfg.d_model * 8
    if cfg.model == "llama":  # the formula without the gate matrix, or with kv = d: the check fails
        for wrong in (dict(gated_ffn=False), dict(n_kv_head=1)):
            assert references.params(dataclasses.replace(shape, **wrong)) != references.params(shape)


def test_llama3_8b_shape_has_its_published_parameter_count():
    m = references.LLAMA3_8B
    model = nnx.eval_shape(lambda: llama.Llama(
        vocab=m.vocab, seq_len=m.context, n_layer=m.n_layer, n_head=m.n_head, n_kv_head=m.n_kv_head,
        d_model=m.d_model, d_ff=m.d_ff, param_dtype=jnp.bfloat16, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)))
    assert count(model) == references.params(m) == 8_030_261_248


def test_a_checkpoint_record_from_before_the_llama_fields_still_resumes():
    """A record saved before --n-kv-head and --d-ff existed lacks them: it reads as their defaults (0), so
    it still resumes a run at the defaults, and not one that sets them."""
    from jaxdp.core.files.record import CheckpointError, check_resumable

    cfg = SMALL.replace(n_kv_head=0, d_ff=0, steps=4)
    old = {k: v for k, v in cfg.to_dict().items() if k not in ("n_kv_head", "d_ff")}
    check_resumable(old, 2, cfg, "ckpt")
    with pytest.raises(CheckpointError, match="d_ff: checkpoint 0, run 64"):
        check_resumable(old, 2, cfg.replace(d_ff=64), "ckpt")
