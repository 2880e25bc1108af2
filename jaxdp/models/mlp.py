"""`mlp`: Dense layers with tanh between them and none after the last. Each layer is one FSDP unit."""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from . import units


def hidden_layer(layer, x):
    return jnp.tanh(layer(x))


def last_layer(layer, x):
    return layer(x)


class MLP(nnx.Module):
    def __init__(self, sizes, *, param_dtype, dtype, rngs: nnx.Rngs):
        self.layers = nnx.List([nnx.Linear(a, b, param_dtype=param_dtype, dtype=dtype, rngs=rngs)
                                for a, b in zip(sizes[:-1], sizes[1:], strict=False)])

    def unit_specs(self) -> list[units.UnitSpec]:
        last = len(self.layers) - 1
        return [units.UnitSpec(f"layers/{i}", (("layers", i),), last_layer if i == last else hidden_layer)
                for i in range(len(self.layers))]

    def __call__(self, x):
        return units.run(self, x)
