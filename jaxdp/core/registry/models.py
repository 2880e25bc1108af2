"""The built-in models, one declared row each: every list of models in jaxdp and torch_ref reads this table.

A row (`Entry`, frozen) holds plain values; nothing here imports a framework (a path is "module:attribute",
imported on first use by `strategies.load`). Its fields:

- `name`: the `--model` value, the same architecture in both frameworks; `summary`: what it is, in one line.
- `jax`, `torch`: the model class in each framework (jaxdp/models/, torch_ref/models/).
- `data`: the `--data` values it trains on, its own first (what a refusal suggests).
- `flags`: the RunConfig fields only some models read that this one reads (`readers.MODEL_FLAGS`).
- `transformer`: a decoder over tokens (attention, the fused kernels, n_layer / n_head / d_model / seq_len).
- `parameters`, `activations`: the path of its theory of bytes and memory in `core/sizes.py`: its exact
  parameter count and what one sample keeps for the backward pass, from `RunConfig` alone.

A model the table does not hold is refused by `entry` in one line naming `--model` and the known ones,
never counted as another.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

TRANSFORMER_FLAGS = ("n_layer", "n_head", "d_model", "seq_len")


@dataclass(frozen=True)
class Entry:
    name: str
    summary: str
    jax: str
    torch: str
    data: tuple
    flags: tuple
    parameters: str
    activations: str
    transformer: bool = False


ENTRIES = (
    Entry("mlp", "a ReLU multilayer perceptron of --hidden widths", "jaxdp.models.mlp:MLP", "torch_ref.models.mlp:MLP",
          ("synthetic", "digits"), ("hidden",), "jaxdp.core.sizes:mlp_parameters",
          "jaxdp.core.sizes:mlp_activations"),
    Entry("gpt", "a character GPT (no qkv bias, an untied head)", "jaxdp.models.gpt:GPT", "torch_ref.models.gpt:GPT",
          ("text",), TRANSFORMER_FLAGS, "jaxdp.core.sizes:gpt_parameters", "jaxdp.core.sizes:gpt_activations",
          transformer=True),
    Entry("cnn", "two 3x3 convolutions with BatchNorm on the 8x8 digits", "jaxdp.models.cnn:CNN",
          "torch_ref.models.cnn:CNN", ("digits",), ("channels", "batchnorm", "conv_bias"),
          "jaxdp.core.sizes:cnn_parameters", "jaxdp.core.sizes:cnn_activations"),
    Entry("gpt2", "GPT-2 (the head tied to the token embedding)", "jaxdp.models.gpt2:GPT2",
          "torch_ref.models.gpt2:GPT2", ("tokens", "llama3-tokens", "text"), TRANSFORMER_FLAGS,
          "jaxdp.core.sizes:gpt2_parameters",
          "jaxdp.core.sizes:gpt_activations", transformer=True),
    Entry("llama", "Llama (RMSNorm, rotary, grouped-query attention, SwiGLU, an untied head)",
          "jaxdp.models.llama:Llama", "torch_ref.models.llama:Llama", ("llama3-tokens", "tokens", "text"),
          TRANSFORMER_FLAGS + ("n_kv_head", "d_ff"), "jaxdp.core.sizes:llama_parameters",
          "jaxdp.core.sizes:llama_activations", transformer=True),
)
BY_NAME = {e.name: e for e in ENTRIES}


def names(**where) -> tuple[str, ...]:
    """The models' names in the table's order, with every `field=value` of `where`."""
    return tuple(e.name for e in ENTRIES if all(getattr(e, k) == v for k, v in where.items()))


def entry(name: str) -> Entry:
    """The row of model `name`; an unknown name is one line naming the flag and the known models."""
    if name not in BY_NAME:
        raise ConfigError(f"--model {name!r} is not a built-in model; valid: {', '.join(BY_NAME)}")
    return BY_NAME[name]


def readers(flag: str) -> tuple[str, ...]:
    """The models that read RunConfig field `flag` (only those listing it in `flags`)."""
    return tuple(e.name for e in ENTRIES if flag in e.flags)
