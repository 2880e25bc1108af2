"""`mlp`: Dense layers with tanh between them and none after the last."""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, sizes, *, param_dtype, dtype, rngs: nnx.Rngs):
        self.layers = nnx.List([nnx.Linear(a, b, param_dtype=param_dtype, dtype=dtype, rngs=rngs)
                                for a, b in zip(sizes[:-1], sizes[1:], strict=False)])

    def __call__(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = jnp.tanh(x)
        return x
