"""jaxdp/precision.py: the census read from a step's jaxpr finds an explicit float32 cast in a float64 model
(forward and backward, named by the class whose method made it), none in an honest float64 model (jaxdp's
Llama), and `jaxdp train` records its model's census in the trace's meta."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxdp import models, precision
from jaxdp.models import llama


class Cast(nnx.Module):
    """A float64 MLP whose activation computes in float32."""

    def __init__(self, rngs):
        self.a = nnx.Linear(4, 4, param_dtype=jnp.float64, dtype=jnp.float64, rngs=rngs)
        self.b = nnx.Linear(4, 2, param_dtype=jnp.float64, dtype=jnp.float64, rngs=rngs)

    def __call__(self, x):
        return self.b(jax.nn.gelu(self.a(x).astype(jnp.float32)).astype(jnp.float64))


def census_of(model, x, y, loss=models.cross_entropy) -> dict:
    problem = models.from_module(model, loss)
    return precision.of_problem(problem, x, y)


def test_an_explicit_float32_cast_in_a_float64_model_is_found():
    c = census_of(Cast(nnx.Rngs(0)), np.zeros((3, 4)), np.zeros((3, 2)), lambda o, y: jnp.mean((o - y) ** 2))
    assert (c["dtype"], c["lowest"]) == ("float64", "float32")
    assert {s["class"] for s in c["sites"]} == {"Cast"}
    assert {("tanh", "forward"), ("convert_element_type", "backward")} <= {(s["op"], s["phase"]) for s in c["sites"]}


def test_an_honest_float64_model_has_none():
    model = llama.Llama(vocab=19, seq_len=8, n_layer=1, n_head=4, n_kv_head=2, d_model=16, d_ff=24,
                        param_dtype=jnp.float64, dtype=jnp.float64, rngs=nnx.Rngs(0))
    tokens = np.zeros((2, 8), np.int64)
    c = census_of(model, tokens, tokens)
    assert (c["dtype"], c["lowest"], c["sites"]) == ("float64", "float64", [])


def test_a_named_scope_names_the_site():
    def loss(p, x):
        with jax.named_scope("head"):
            return jnp.sum(jnp.sin(p.astype(jnp.float32)))

    c = precision.census(jax.grad(loss), np.ones(3), np.ones(3))
    assert {s["module"] for s in c["sites"]} == {"head"}
