"""The registry (jaxdp/core/registry/): one row per strategy and per model, and the lists that read it say what
they said when each was written out by hand (the CLI's choices in their order, the option tables, the layouts);
a model or strategy the registry does not hold is refused in one line, never taken for another."""
from __future__ import annotations

import importlib.util

import pytest

from jaxdp.core.errors import ConfigError
from jaxdp.core.registry import models, strategies
from jaxdp.core.run import config, readers
from jaxdp.core.run.config import RunConfig

pytestmark = pytest.mark.quick
HAS_TORCH = importlib.util.find_spec("torch") is not None

# The lists as they were written out by hand before the registry: they must not move.
# (diloco came after, as one row: docs/EXTENDING.md)
JAX = ("single", "dp", "ddp", "ddp-pmap", "ddp-bucket", "ddp-ring", "zero1", "zero2", "zero3", "hsdp", "diloco",
       "ddp-jit", "zero1-jit", "fsdp-jit")
TORCH = ("single", "dp", "ddp", "ddp-naive", "ddp-bucket", "ddp-ring", "zero1", "zero2", "zero3", "hsdp", "diloco",
         "ddp-jit", "zero1-jit", "fsdp-jit")


def test_the_cli_choices_keep_their_order():
    assert config.FRAMEWORK_STRATEGIES == {"jax": JAX, "torch": TORCH}
    assert config.ALL_STRATEGIES == JAX + ("ddp-naive",)
    assert config.MODELS == ("mlp", "gpt", "cnn", "gpt2", "llama")
    assert config.JIT_STRATEGIES == ("ddp-jit", "zero1-jit", "fsdp-jit")
    choices = {f.name: f.metadata["choices"] for f in config.dataclasses.fields(RunConfig)}
    assert choices["strategy"] == JAX + ("ddp-naive", "fsdp") and choices["model"] == config.MODELS


def test_every_row_names_a_known_oracle_intent_and_twin():
    for e in strategies.ENTRIES:
        # a strategy to equal, or (one not meant to equal one) its own reference, "module:attribute"
        assert e.oracle in strategies.BY_NAME or callable(strategies.load(e.oracle)), e.name
        assert strategies.entry(e.intent).intent == e.intent, e.name  # an intent is a strategy that is its own
        assert not e.twin or strategies.entry(e.twin).torch, e.name
        assert e.in_framework("jax") or e.in_framework("torch"), e.name


def test_the_jax_factories_and_options_are_the_rows():
    import jaxdp.strategies as jax_strategies

    assert tuple(jax_strategies.FACTORIES) == JAX
    for name, make in jax_strategies.FACTORIES.items():
        assert make is strategies.load(strategies.entry(name).jax), name
    for flag, names in readers.STRATEGY_FLAGS["jax"].items():  # the flags' readers are the options' readers
        assert names == tuple(s for s, opts in jax_strategies.OPTIONS.items() if flag in opts), flag


def test_the_layout_rows_shard_what_the_entries_say():
    from jaxdp.strategies.jit import layout as jit_layout
    from jaxdp.strategies.zero import layout as zero_layout

    for e in strategies.ENTRIES:
        if e.comm == "zero":
            row = zero_layout.LAYOUTS[e.name]
            assert (row.shards_params, row.shards_grads, row.shards_opt_state) == e.shards, e.name
        elif e.comm == "jit":
            assert jit_layout.LAYOUTS[e.name] is getattr(jit_layout, e.layout)
            assert tuple(jit_layout.LAYOUTS[e.name].sharded().values()) == e.shards, e.name
        else:
            assert e.shards == (False, False, False) and zero_layout.of(e.name) is zero_layout.REPLICATED, e.name


@pytest.mark.skipif(not HAS_TORCH, reason="torch_ref's tables need torch")
def test_the_torch_factories_twins_and_layouts_are_the_rows():
    import torch_ref.strategies as torch_strategies
    from torch_ref.strategies.zero import layout as torch_layout

    assert tuple(torch_strategies.FACTORIES) + tuple(torch_strategies.TWINS) == TORCH
    assert torch_strategies.TWINS == {"ddp-jit": "ddp", "zero1-jit": "zero1", "fsdp-jit": "zero3"}
    for name, make in torch_strategies.FACTORIES.items():
        assert make is strategies.load(strategies.entry(name).torch), name
    for flag, names in readers.STRATEGY_FLAGS["torch"].items():
        assert names == tuple(s for s, opts in torch_strategies.OPTIONS.items() if flag in opts), flag
    for e in strategies.ENTRIES:
        if e.comm == "zero":
            row = torch_layout.LAYOUTS[e.name]
            assert (row.shards_params, row.shards_grads, row.shards_opt_state) == e.shards, e.name
    assert torch_layout.LAYOUTS["fsdp"] is torch_layout.LAYOUTS["zero3"]


def test_an_unknown_strategy_or_model_is_one_line_naming_the_flag():
    with pytest.raises(ConfigError, match=r"^--strategy 'diloko' is not a strategy; valid: single, .*\(= zero3\)$"):
        strategies.entry("diloko")
    assert strategies.entry("fsdp") is strategies.entry("zero3")
    assert strategies.get("my-own", "grid", False) is False  # a user's own name: no row, the default
    with pytest.raises(ConfigError, match=r"^--model 'mixtral' is not a built-in model; valid: mlp, gpt, cnn, gpt2, "
                                          r"llama$"):
        models.entry("mixtral")


def _unknown_model() -> RunConfig:
    cfg = RunConfig()
    object.__setattr__(cfg, "model", "mixtral")  # as a user's own RunConfig could carry it, unvalidated
    return cfg


def test_jaxdp_builds_no_model_the_registry_does_not_hold():
    from jaxdp import models as jax_models

    with pytest.raises(ConfigError, match="^--model 'mixtral' is not a built-in model"):
        jax_models.build(_unknown_model(), None)


@pytest.mark.skipif(not HAS_TORCH, reason="torch_ref needs torch")
def test_torch_ref_builds_no_model_the_registry_does_not_hold():
    from torch_ref import models as torch_models

    with pytest.raises(ConfigError, match="^--model 'mixtral' is not a built-in model"):
        torch_models.build(_unknown_model(), None)


def test_the_models_rows_are_the_readers_and_the_sizes():
    from jaxdp.core.memory import sizes

    assert readers.TRANSFORMERS == ("gpt", "gpt2", "llama")
    assert readers.MODEL_FLAGS["hidden"] == ("mlp",) and readers.MODEL_FLAGS["d_ff"] == ("llama",)
    for e in models.ENTRIES:
        assert callable(strategies.load(e.parameters)) and callable(strategies.load(e.activations)), e.name
        assert strategies.load(e.parameters).__module__ == sizes.__name__


def test_the_docs_tables_are_the_rows():
    from jaxdp.core.registry import table

    page = table.PAGE.read_text(encoding="utf-8")
    assert table.written(page) == page, "docs/REGISTRY.md's tables differ from the rows: run python -m " \
                                        "jaxdp.core.registry.table --write"
    assert "| `zero2` | ZeRO stage 2" in page and "| `llama` |" in page


def test_every_models_class_is_where_its_row_says():
    for e in models.ENTRIES:
        assert strategies.load(e.jax).__name__ == e.jax.rpartition(":")[2], e.name
        if HAS_TORCH:
            assert strategies.load(e.torch).__name__ == e.torch.rpartition(":")[2], e.name
