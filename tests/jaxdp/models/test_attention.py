"""`--kernels fused` on the JAX side (jaxdp/models/attention.py, cast_once.py, jaxdp/core/run/kernels.py):
`jax.nn.dot_product_attention` computes what the written-out attention computes (gpt, gpt2, llama with
grouped-query heads), to float32 roundoff; bf16 weights are cast once per step (a tied weight once, not once
per use); the library's `kernels=` switches a module's attention and leaves the module as it was; what fused
cannot do is refused in one line."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import jaxdp
from jaxdp import models
from jaxdp.core.run.config import ConfigError, RunConfig
from jaxdp.models import GPT, GPT2, Llama, attention, cast_once

SIZES = dict(vocab=50, seq_len=16, n_layer=2, n_head=4, d_model=32)
FAMILIES = {"gpt": (GPT, {}), "gpt2": (GPT2, {}), "llama": (Llama, dict(n_kv_head=2, d_ff=64))}
TOKENS = jnp.arange(64).reshape(4, 16) % 50


def _model(family, kernels, dtype=jnp.float32):
    cls, extra = FAMILIES[family]
    return cls(**SIZES, **extra, param_dtype=jnp.float32, dtype=dtype, rngs=nnx.Rngs(0), kernels=kernels)


def _loss_and_grads(family, kernels):
    problem = models.from_module(_model(family, kernels), models.cross_entropy)
    return jax.value_and_grad(problem.loss_fn)(problem.params, TOKENS, TOKENS)


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_attention_computes_the_mirrored_one_to_float32_roundoff(family):
    """Same loss and gradients within 1e-5 relative per tensor (the judge's float32 gradient bound): XLA's
    composition of dot_product_attention reorders the same sums; a wrong head mapping or scale is O(1)."""
    (la, ga), (lb, gb) = _loss_and_grads(family, "fused"), _loss_and_grads(family, "mirrored")
    assert abs(float(la - lb)) <= 1e-5 * abs(float(lb))
    for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True):
        assert float(jnp.linalg.norm(a - b)) <= 1e-5 * float(jnp.linalg.norm(b)) + 1e-30


def test_a_wrong_head_mapping_is_not_within_that_bound():
    """The bound above can fail: llama's key/value heads swapped between groups moves the loss by far more."""
    def swapped(q, k, v):
        return jax.nn.dot_product_attention(q, k[:, :, ::-1], v[:, :, ::-1], is_causal=True)
    base, _ = _loss_and_grads("llama", "fused")
    original = attention.fused
    attention.fused = swapped
    try:
        wrong, _ = _loss_and_grads("llama", "fused")
    finally:
        attention.fused = original
    assert abs(float(wrong - base)) > 1e-5 * abs(float(base))


def _param_casts(fn, params) -> list[int]:
    """For each parameter (a jaxpr input), how many times the traced loss converts it to bf16."""
    jaxpr = jax.make_jaxpr(fn)(params, TOKENS, TOKENS).jaxpr
    inputs = jaxpr.invars[:len(jax.tree.leaves(params))]
    casts = [e.invars[0] for e in jaxpr.eqns if e.primitive.name == "convert_element_type"
             and e.params["new_dtype"] == jnp.bfloat16]
    return [sum(c is v for c in casts) for v in inputs]


def test_bf16_weights_are_cast_once_per_step_a_tied_one_included():
    """gpt2 in bf16: flax's per-call casts convert the tied `wte` at each use (embedding and head); cast once,
    every parameter is converted exactly once, and the gradients stay float32."""
    model = _model("gpt2", "fused", jnp.bfloat16)
    params = models.from_module(model, models.cross_entropy).params
    per_call = models.from_module(_model("gpt2", "mirrored", jnp.bfloat16), models.cross_entropy)
    once = cast_once.problem(models.from_module(model, models.cross_entropy), jnp.bfloat16)
    assert max(_param_casts(per_call.loss_fn, params)) == 2  # wte, at the embedding and at the head
    assert set(_param_casts(once.loss_fn, params)) == {1}
    grads = jax.grad(once.loss_fn)(params, TOKENS, TOKENS)
    assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}


def test_the_library_switches_a_modules_attention_and_leaves_the_module_as_it_was():
    model = _model("gpt2", "mirrored")
    par = jaxdp.parallelize(model, None, optax.sgd(0.1), loss=models.cross_entropy, strategy="single",
                            kernels="fused")
    assert all(m.kernels == "mirrored" for _, m in nnx.iter_graph(model) if hasattr(m, "kernels"))
    reference = models.from_module(_model("gpt2", "fused"), models.cross_entropy)
    assert float(par.problem.loss_fn(par.problem.params, TOKENS, TOKENS)) == float(
        reference.loss_fn(reference.params, TOKENS, TOKENS))
    # the default leaves a module as built (torch_ref's rule): llama, whose two paths' losses differ in their bits
    built_fused = jaxdp.parallelize(_model("llama", "fused"), None, optax.sgd(0.1), loss=models.cross_entropy,
                                    strategy="single")
    def grads(loss_fn):
        return jax.tree.leaves(jax.grad(loss_fn)(built_fused.problem.params, TOKENS, TOKENS))

    paths = {k: grads(models.from_module(_model("llama", k), models.cross_entropy).loss_fn)
             for k in ("fused", "mirrored")}
    assert not all(bool((a == b).all()) for a, b in zip(paths["fused"], paths["mirrored"], strict=True))
    assert all(bool((a == b).all()) for a, b in zip(grads(built_fused.problem.loss_fn), paths["fused"], strict=True))


@pytest.mark.parametrize("kw, message", [
    (dict(kernels="flash"), "kernels='flash'; valid: mirrored, fused"),
    (dict(compute_dtype=jnp.bfloat16), "compute_dtype= casts the weights once per step, which is kernels='fused'"),
])
def test_library_arguments_are_one_line(kw, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        jaxdp.parallelize(_model("gpt", "mirrored"), None, optax.sgd(0.1), loss=models.cross_entropy,
                          strategy="single", **kw)


@pytest.mark.parametrize("changes, message", [
    (dict(dtype="float64"), "--kernels fused has no float64 path"),
    (dict(reduction="canonical"), "--reduction canonical cannot give the same bits"),
])
def test_what_fused_cannot_do_is_one_line(changes, message):
    cfg = RunConfig(model="gpt", data="text", kernels="fused", **changes)
    with pytest.raises(ConfigError, match=message):
        cfg.validate()
