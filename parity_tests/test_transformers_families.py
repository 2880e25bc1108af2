"""`jaxdp.models.Llama`'s options (`qkv_bias`, `tie_embeddings`, `rope_theta`, `rms_eps`, `padding_idx`)
against transformers' own Qwen2, Mistral and Llama-with-`pad_token_id` built from tiny configs, and
the unit that owns only a tied weight under the sharded strategies.

- Across frameworks: the transformers model trained by `torch_ref.parallelize` ('single'), jaxdp's Llama
  built from `torch_ref.models.llama.config_kwargs(config)` and started from the transformers weights
  (`convert.to_flax(..., target=)`), 3 steps of AdamW (torch's default weight decay 0.01), judged by
  `jaxdp.parity.judge` with the default bounds: float32 as they are; float64 with transformers' float32
  sites (RMSNorm, rotary angles, softmax: docs/LLAMA.md) switched to float64. Adam turns Qwen2's
  roundoff-level bias gradients into parameters apart, which the next gradients carry: the error model's
  `propagated` term (docs/PARITY.md).
- jaxdp against its torch twin with every option on (float64, 1e-12), padding_idx's row: no gradient.
- A tied Llama's first unit owns no parameter of its own (the embedding goes to the root): zero3, hsdp
  and fsdp-jit train it as `single` does (float64, 1e-12); before the fix zero3 and hsdp crashed in
  their first backward (`tie` of an empty tree).
- `convert.to_flax` warns, one line, when the torch embedding's padding_idx is not the target's.
"""
from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxdp
from jaxdp import models
from jaxdp.core.traces import trace
from jaxdp.judge import parity
from jaxdp.models import llama

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch_ref import convert  # noqa: E402
from torch_ref.models import llama as torch_llama  # noqa: E402

SHAPE = dict(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=16, attn_implementation="eager")
# family -> (config class, model class, what its config sets beyond the shape)
FAMILIES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True,
                                                      rope_parameters=dict(rope_type="default", rope_theta=1e6))),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(rms_norm_eps=1e-5)),
    "llama-pad": ("LlamaConfig", "LlamaForCausalLM", dict(pad_token_id=0)),
}
STEPS, BATCH, SEQ, LR, WEIGHT_DECAY = 3, 4, 8, 1e-2, 0.01  # AdamW with torch's default weight decay


def hf_model(family: str, dtype):
    config_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**SHAPE, **extra)
    return getattr(transformers, model_cls)(config).to(dtype)


def batches(seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, SHAPE["vocab_size"], (STEPS, BATCH, SEQ + 1))
    tokens[:, 0, :3] = 0  # the pad id appears: its row's (absent) gradient is compared too
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def meta(dtype: str, framework: str) -> dict:
    return {"framework": framework, "dtype": dtype, "optimizer": "adamw", "lr": LR, "weight_decay": WEIGHT_DECAY,
            "steps": STEPS, "batch_size": BATCH}


def torch_trace(model, dtype: str) -> trace.Trace:
    import torch_ref

    def loss_fn(out, y):
        return torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), y.flatten())

    model, opt = torch_ref.parallelize(model, strategy="single",
                                       optimizer=lambda ps: torch.optim.AdamW(ps, lr=LR, weight_decay=WEIGHT_DECAY))
    rec = torch_ref.trace.Recorder(None, meta(dtype, "torch"), model, strip_prefix="model.")
    rec.init()
    for k, (x, y) in enumerate(batches(), start=1):
        rec.step(k, torch_ref.train_step(model, opt, torch.from_numpy(x), torch.from_numpy(y), loss_fn), x, y)
    return trace.Trace(rec.meta, rec.arrays)


def jax_trace(family: str, dtype: str, hf, **change) -> trace.Trace:
    model = llama.Llama(**{**torch_llama.config_kwargs(hf.config), **change}, param_dtype=getattr(jnp, dtype),
                        dtype=getattr(jnp, dtype), rngs=nnx.Rngs(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error" if not change else "ignore", convert.ConvertWarning)  # carried: no warning
        init = convert.to_flax(hf, strip_prefix="model.", target=model)
    par = jaxdp.parallelize(model, init, jaxdp.optim.make("adamw", LR, WEIGHT_DECAY), strategy="single", devices=1,
                            loss=models.cross_entropy, return_grads=True)
    state = par.init()
    rec = jaxdp.trace.Recorder(None, meta(dtype, "jax"))
    rec.init(init)
    for k, (x, y) in enumerate(batches(), start=1):
        state, metrics = par.step(state, x, y)
        rec.step(k, metrics["loss"], metrics["grads"], par.params(state), x, y)
    return trace.Trace(rec.meta, rec.arrays)


@pytest.fixture
def hf_float32_sites_in_float64(monkeypatch):
    """transformers' float32 sites promoted to float64 in the three families: RMSNorm's upcast, the
    rotary angles (inv_freq and positions in float32), eager attention's softmax(dtype=float32)."""
    def norm(self, h):
        return self.weight * (h * torch.rsqrt(h.square().mean(-1, keepdim=True) + self.variance_epsilon))

    def rotary(self, x, position_ids):
        dim, theta = 2 * self.inv_freq.shape[0], self.config.rope_parameters["rope_theta"]
        angles = position_ids[..., None].double() / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)

    for family, prefix in (("llama", "Llama"), ("qwen2", "Qwen2"), ("mistral", "Mistral")):
        module = __import__(f"transformers.models.{family}.modeling_{family}", fromlist=["_"])
        monkeypatch.setattr(getattr(module, f"{prefix}RMSNorm"), "forward", norm)
        monkeypatch.setattr(getattr(module, f"{prefix}RotaryEmbedding"), "forward", rotary)
    softmax = torch.nn.functional.softmax
    monkeypatch.setattr(torch.nn.functional, "softmax", lambda x, dim=None, dtype=None, **kw: softmax(x, dim=dim))


def judged(family: str, dtype: str, **change) -> parity.Row:
    hf = hf_model(family, getattr(torch, dtype))
    b = jax_trace(family, dtype, hf, **change)  # before torch trains the model in place
    a = torch_trace(hf, dtype)
    row = parity.judge(a, b, sides=("transformers", "jaxdp"))
    print(f"{family} {dtype}: " + ", ".join(f"{f} {row.worst[f]:.3g} (bound {getattr(row.tol, f, float('nan')):.3g})"
                                             for f in ("loss", "grad", "param", "update")))
    return row


@pytest.mark.parametrize("family", FAMILIES)
def test_jaxdp_llama_trains_as_transformers_family_in_float32(family):
    row = judged(family, "float32")
    assert row.ok, "; ".join(row.failures)


@pytest.mark.parametrize("family", ["qwen2", "llama-pad"])  # mistral's float64 adds only rms_eps (the twin test has it)
def test_jaxdp_llama_trains_as_transformers_family_in_float64(family, hf_float32_sites_in_float64):
    row = judged(family, "float64")
    assert row.ok, "; ".join(row.failures)


def test_the_judge_sees_a_padding_row_trained_in_float32():
    """Negative control: jaxdp's Llama without padding_idx on a config with pad_token_id trains row 0,
    which transformers does not: a gradient mismatch at step 1, in float32."""
    row = judged("llama-pad", "float32", padding_idx=None)
    assert not row.ok and "embed_tokens" in row.worst_key["grad"]


def test_convert_says_in_one_line_when_padding_idx_is_not_carried():
    hf = hf_model("llama-pad", torch.float32)
    untied = llama.Llama(**{**torch_llama.config_kwargs(hf.config), "padding_idx": None}, param_dtype=jnp.float32,
                         dtype=jnp.float32, rngs=nnx.Rngs(0))
    for target, says in ((None, "no target="), (untied, "the target has None")):
        with pytest.warns(convert.ConvertWarning) as caught:
            convert.to_flax(hf, strip_prefix="model.", target=target)
        (line,) = [str(w.message) for w in caught]
        assert line.startswith("torch_ref.convert: model.embed_tokens has padding_idx=0 (that row gets no gradient)")
        assert says in line and "padding_idx=0" in line and "\n" not in line


@pytest.mark.parametrize("family,change,says", [
    ("llama-pad", dict(attention_bias=True), "attention_bias=True (o_proj's bias too"),
    ("mistral", dict(sliding_window=4), "sliding_window 4 < max_position_embeddings 16"),
    ("llama-pad", dict(hidden_act="gelu"), "hidden_act 'gelu'"),
])
def test_config_kwargs_names_what_llama_cannot_express(family, change, says):
    config_cls, _, extra = FAMILIES[family]
    config = getattr(transformers, config_cls)(**SHAPE, **{**extra, **change})
    start = f"^{type(config).__name__} asks for what jaxdp's Llama cannot express: "
    with pytest.raises(ValueError, match=start) as e:
        torch_llama.config_kwargs(config)
    assert says in str(e.value) and "\n" not in str(e.value)


# ---- jaxdp against its torch twin, every option on ---------------------------------------------------
DIMS = dict(vocab=19, seq_len=8, n_layer=2, n_head=4, n_kv_head=2, d_model=16, d_ff=24)
OPTIONS = dict(qkv_bias=True, rope_theta=1e6, rms_eps=1e-5, padding_idx=3)


def jax_llama(**options):
    model = llama.Llama(**DIMS, **options, param_dtype=jnp.float64, dtype=jnp.float64, rngs=nnx.Rngs(0))
    p = models.from_module(model, models.cross_entropy)
    keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(p.params))))
    # every parameter moved off its init (the q/k/v biases start at zero), the padding row included
    return p._replace(params=jax.tree.map(lambda a: a + 0.1 * jax.random.normal(next(keys), a.shape), p.params))


def test_every_option_equals_the_torch_twin_in_float64(tied=True):
    """Tied, biased, theta 1e6, eps 1e-5, padding row 3 (untied padding: the llama-pad runs above)."""
    p = jax_llama(tie_embeddings=tied, **OPTIONS)
    x, y = (np.random.default_rng(s).integers(0, DIMS["vocab"], (3, 8)) for s in (0, 1))
    x[0, :2] = OPTIONS["padding_idx"]
    logits = np.asarray(jax.jit(p.apply)(p.params, x))
    grads = {k: np.asarray(v) for k, v in models.flat_names(jax.jit(jax.grad(p.loss_fn))(p.params, x, y)).items()}
    twin = torch_llama.Llama(**DIMS, tie_embeddings=tied, **OPTIONS).double()
    convert.load_flax(twin, {k: np.asarray(v) for k, v in models.flat_names(p.params).items()})
    t_logits = twin(torch.from_numpy(x))
    torch.nn.functional.cross_entropy(t_logits.reshape(-1, DIMS["vocab"]), torch.from_numpy(y).reshape(-1)).backward()
    t_grads = convert.tensors_to_flax(twin, {n: t.grad for n, t in twin.named_parameters()})
    assert t_grads.keys() == grads.keys() and ("lm_head/kernel" in grads) != tied
    assert "layers/1/self_attn/k_proj/bias" in grads
    assert np.abs(logits - t_logits.detach().numpy()).max() <= 1e-12 * np.abs(logits).max()
    for k in grads:
        assert np.abs(grads[k] - t_grads[k]).max() <= 1e-12 * np.abs(grads[k]).max(), k
    pad_row = grads["embed_tokens/embedding"][OPTIONS["padding_idx"]]
    assert (np.abs(pad_row).max() > 0) == tied  # untied: no gradient at all; tied: the head's use only


# ---- a unit owning only the tied weight, under the sharded strategies ---------------------------------
@functools.cache
def trained(strategy: str, devices: int, accum: int = 1, options: tuple = ()):
    """The tied Llama's parameters after 2 steps of momentum SGD under `strategy` (its units: the model's)."""
    model = llama.Llama(**DIMS, tie_embeddings=True, **OPTIONS, param_dtype=jnp.float64, dtype=jnp.float64,
                        rngs=nnx.Rngs(0))
    par = jaxdp.parallelize(model, jax_llama(tie_embeddings=True, **OPTIONS).params, optax.sgd(0.1, momentum=0.9),
                            strategy=strategy, devices=devices, accum=accum, loss=models.cross_entropy, **dict(options))
    state = par.init()
    rng = np.random.default_rng(2)
    for _ in range(2):
        x, y = (rng.integers(0, DIMS["vocab"], (8, 8)) for _ in range(2))
        state, _ = par.step(state, x, y)
    return models.flat_names(par.params(state))


@pytest.mark.parametrize("strategy,accum,options", [
    ("zero3", 1, {}), ("hsdp", 2, dict(replicas=2, reshard_after_forward=False)), ("fsdp-jit", 1, {})],
    ids=["zero3", "hsdp-keep-acc2", "fsdp-jit"])
def test_a_unit_owning_only_the_tied_embedding_trains_as_single(strategy, accum, options):
    units = jax_llama(tie_embeddings=True).units  # the first unit lists only the shared (root's) weight
    assert units[0].paths == (("embed_tokens",),) and units[-1].paths == (("norm",), ("embed_tokens",))
    ref, got = trained("single", 1), trained(strategy, 4, accum, tuple(options.items()))
    for k in ref:
        assert np.abs(np.asarray(got[k]) - ref[k]).max() <= 1e-12 * np.abs(ref[k]).max(), k
