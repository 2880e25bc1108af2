"""torch_ref.convert: each layer type against the real NNX layer (same output after conversion, float64
1e-12), exact round trips, one error listing every mismatch, names= overrides, the built-in models,
and wrapped models."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from torch import nn

from jaxdp import models as jax_models
from jaxdp.core.run import data
from tests.convert_ranks import Net, fsdp2_round_trip
from tests.torch_helpers import BASE, GPT, init_for, init_key
from torch_ref import convert, models

DTYPES = {"float64": (jnp.float64, torch.float64), "float32": (jnp.float32, torch.float32),
          "bfloat16": (jnp.bfloat16, torch.bfloat16)}
# name: (torch layer, NNX layer from (rngs, param_dtype), input shape in Flax layout, integer input?)
# Convs take channels-last inputs in Flax and channels-first in torch; the test moves the axis.
LAYERS = {
    "linear": (lambda: nn.Linear(3, 5), lambda r, d: nnx.Linear(3, 5, param_dtype=d, rngs=r), (4, 3), False),
    "linear-no-bias": (lambda: nn.Linear(3, 5, bias=False),
                       lambda r, d: nnx.Linear(3, 5, use_bias=False, param_dtype=d, rngs=r), (4, 3), False),
    "conv1d": (lambda: nn.Conv1d(3, 4, 3),
               lambda r, d: nnx.Conv(3, 4, (3,), padding="VALID", param_dtype=d, rngs=r), (2, 7, 3), False),
    "conv2d": (lambda: nn.Conv2d(4, 6, (2, 3), stride=2, groups=2),
               lambda r, d: nnx.Conv(4, 6, (2, 3), strides=2, padding="VALID", feature_group_count=2,
                                     param_dtype=d, rngs=r), (2, 7, 8, 4), False),
    "conv3d": (lambda: nn.Conv3d(2, 3, 2),
               lambda r, d: nnx.Conv(2, 3, (2, 2, 2), padding="VALID", param_dtype=d, rngs=r), (1, 4, 5, 3, 2), False),
    "embedding": (lambda: nn.Embedding(7, 4), lambda r, d: nnx.Embed(7, 4, param_dtype=d, rngs=r), (3, 5), True),
    "layernorm": (lambda: nn.LayerNorm(6, eps=1e-5),
                  lambda r, d: nnx.LayerNorm(6, epsilon=1e-5, param_dtype=d, rngs=r), (4, 6), False),
    "rmsnorm": (lambda: nn.RMSNorm(6, eps=1e-6),
                lambda r, d: nnx.RMSNorm(6, epsilon=1e-6, param_dtype=d, rngs=r), (4, 6), False),
    "batchnorm1d": (lambda: nn.BatchNorm1d(5).eval(),
                    lambda r, d: nnx.BatchNorm(5, use_running_average=True, param_dtype=d, rngs=r), (4, 5), False),
    "batchnorm2d": (lambda: nn.BatchNorm2d(3).eval(),
                    lambda r, d: nnx.BatchNorm(3, use_running_average=True, param_dtype=d, rngs=r),
                    (2, 4, 4, 3), False),
}


def random_flax(name: str, dtype: str, seed: int = 0) -> dict:
    """The state of the NNX layer `name` as a pure dict of NumPy arrays, every leaf random in `dtype`
    (variances positive). Shapes come from the real layer, abstractly (no initialiser compiles).
    NNX keeps BatchNorm's statistics in float32 whatever param_dtype: here they take `dtype`, as
    torch's `.to(dtype)` does for its buffers."""
    make_flax = LAYERS[name][1]
    shapes = nnx.to_pure_dict(nnx.state(nnx.eval_shape(lambda: make_flax(nnx.Rngs(0), jnp.float32))))
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda a: rng.uniform(0.5, 1.5, a.shape).astype(DTYPES[dtype][0]), shapes)


def torch_input(x: np.ndarray, name: str) -> torch.Tensor:
    t = torch.from_numpy(x)
    return t.movedim(-1, 1) if name.startswith(("conv", "batchnorm2d")) else t


def forward_error(name: str) -> float:
    """Max |torch - NNX| of the layer's outputs in float64 after converting the NNX parameters."""
    make_torch, make_flax, shape, integer = LAYERS[name]
    pure = random_flax(name, "float64")
    flax_layer = nnx.eval_shape(lambda: make_flax(nnx.Rngs(0), jnp.float64))
    nnx.update(flax_layer, jax.tree.map(jnp.asarray, pure))
    torch_layer = convert.load_flax(make_torch().double(), pure)
    rng = np.random.default_rng(1)
    x = rng.integers(0, 7, shape) if integer else rng.normal(size=shape)
    with torch.no_grad():
        out = torch_layer(torch_input(x, name))
    out = out.movedim(1, -1) if name.startswith(("conv", "batchnorm2d")) else out
    return float(np.max(np.abs(out.numpy() - np.asarray(flax_layer(jnp.asarray(x))))))


@pytest.mark.parametrize("name", LAYERS)
def test_each_layer_computes_as_the_nnx_layer(name):
    assert forward_error(name) < 1e-12


def test_a_missing_transpose_is_caught(monkeypatch):
    """The comparison can fail: a Linear rule without its transpose (a square layer, so shapes agree)."""
    monkeypatch.setitem(LAYERS, "linear", (lambda: nn.Linear(4, 4),
                                           lambda r, d: nnx.Linear(4, 4, param_dtype=d, rngs=r), (3, 4), False))
    assert forward_error("linear") < 1e-12
    monkeypatch.setitem(convert.RULES, nn.Linear, {**convert.RULES[nn.Linear], "weight": ("kernel", lambda t: None)})
    assert forward_error("linear") > 1e-3


def assert_same_tree(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", LAYERS)
def test_round_trip_is_exact(name, dtype):
    pure = random_flax(name, dtype, seed=2)
    model = convert.load_flax(LAYERS[name][0]().to(DTYPES[dtype][1]), pure)
    assert_same_tree(convert.to_flax(model), pure)
    assert_same_tree(convert.to_flax(convert.load_flax(model, convert.flatten(pure))), pure)  # flat input too


class FlaxNet(nnx.Module):
    def __init__(self, rngs, dtype=jnp.float32):
        self.convs = nnx.List([nnx.Conv(3, 4, (3, 3), param_dtype=dtype, rngs=rngs),
                               nnx.Conv(4, 4, (3, 3), param_dtype=dtype, rngs=rngs)])
        self.norm = nnx.BatchNorm(4, param_dtype=dtype, rngs=rngs)
        self.head = nnx.Linear(4, 2, param_dtype=dtype, rngs=rngs)


def flax_net_params(dtype=np.float32) -> dict:
    shapes = nnx.to_pure_dict(nnx.state(nnx.eval_shape(lambda: FlaxNet(nnx.Rngs(0)))))
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda a: rng.uniform(0.5, 1.5, a.shape).astype(dtype), shapes)


def test_module_paths_and_list_indices_map_to_the_nnx_structure():
    params = flax_net_params()
    model = convert.load_flax(Net(), params)
    assert convert.flax_names(model) == {
        "convs.0.weight": "convs/0/kernel", "convs.0.bias": "convs/0/bias", "convs.1.weight": "convs/1/kernel",
        "convs.1.bias": "convs/1/bias", "norm.weight": "norm/scale", "norm.bias": "norm/bias",
        "head.weight": "head/kernel", "head.bias": "head/bias", "norm.running_mean": "norm/mean",
        "norm.running_var": "norm/var"}  # parameters in named_parameters() order, then buffers
    assert_same_tree(convert.to_flax(model), params)
    assert np.array_equal(model.convs[1].weight.detach().numpy(), params["convs"][1]["kernel"].transpose(3, 2, 0, 1))
    state = nnx.state(nnx.eval_shape(lambda: FlaxNet(nnx.Rngs(0))))
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
    assert_same_tree(convert.to_flax(convert.load_flax(Net(), state)), params)  # an nnx.State as it is


def test_every_mismatch_is_listed_in_one_error():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(2, 3))  # no rule for a bare parameter
            self.fc = nn.Linear(3, 2)
            self.norm = nn.BatchNorm1d(2)

    params = {"fc": {"kernel": np.zeros(2, np.float32), "bias": np.zeros(2, np.float64)},
              "norm": {"scale": np.ones(3, np.float32), "bias": np.zeros(2, np.float32),
                       "mean": np.zeros(2, np.float32)},
              "extra": {"x": np.zeros(1, np.float32)}}
    model = Odd()
    before = model.fc.weight.detach().clone()
    with pytest.raises(convert.ConvertError) as err:
        convert.load_flax(model, params)
    message = str(err.value)
    assert "\n" not in message and message.startswith("6 tensor(s) do not match") and "pass names=" in message
    for part in ("torch 'w' (Odd has no rule) has no Flax name", "Flax 'fc/kernel' (2,) vs torch 'fc.weight' (2, 3)",
                 "Flax 'fc/bias' (2,) torch.float64", "cast one side", "Flax 'norm/scale' (3,) torch.float32",
                 "torch 'norm.running_var' has no Flax 'norm/var'",
                 "Flax 'extra/x' has no torch tensor"):
        assert part in message, part
    assert torch.equal(model.fc.weight, before)  # nothing copied: all or nothing


def test_rng_state_is_named_with_the_filter_that_drops_it():
    class Drop(nnx.Module):
        def __init__(self, rngs):
            self.fc = nnx.Linear(2, 2, rngs=rngs)
            self.drop = nnx.Dropout(0.1, rngs=rngs)

    flax = nnx.eval_shape(lambda: Drop(nnx.Rngs(0)))
    pure = nnx.to_pure_dict(nnx.state(flax))
    with pytest.raises(convert.ConvertError, match=r"Flax 'drop/rngs/count' has no torch tensor.*nnx.Param"):
        convert.load_flax(nn.Sequential(), pure)


def test_two_tensors_on_one_flax_name_and_unknown_names_are_errors():
    model = nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.Linear(2, 2)})
    with pytest.raises(convert.ConvertError, match=r"Flax 'a/kernel' claimed by torch 'a.weight', 'b.weight'"):
        convert.flax_names(model, names={"b.weight": "a/kernel"})
    with pytest.raises(convert.ConvertError, match=r"names= has 'c.weight': no such torch parameter"):
        convert.flax_names(model, names={"c.weight": "c/kernel"})
    with pytest.raises(convert.ConvertError, match=r"names= has 'a.weight': \('a/k', \(0, 2\)\) is not a Flax name, "
                       r"\(Flax name, axes\) with axes a permutation of \(0, 1\), or None"):
        convert.flax_names(model, names={"a.weight": ("a/k", (0, 2))})
    with pytest.raises(convert.ConvertError, match=r"torch 'c.weight' is no parameter or buffer"):
        convert.tensors_to_flax(model, {"c.weight": torch.zeros(2)})


class Custom(nn.Module):
    """Parameters under a module type the rules do not know, and a torch-only one."""

    def __init__(self):
        super().__init__()
        self.w_in_out = nn.Parameter(torch.randn(3, 5, dtype=torch.float64))   # stored as Flax does
        self.w_out_in = nn.Parameter(torch.randn(5, 3, dtype=torch.float64))   # stored transposed
        self.gate = nn.Parameter(torch.randn(1, dtype=torch.float64))          # no Flax counterpart
        self.fc = nn.Linear(3, 5).double()


def test_names_override_rename_layout_and_skip():
    rng = np.random.default_rng(0)
    params = {"a": {"kernel": rng.normal(size=(3, 5))}, "b": {"kernel": rng.normal(size=(3, 5))},
              "dense": {"kernel": rng.normal(size=(3, 5)), "bias": rng.normal(size=5)}}
    names = {"w_in_out": "a/kernel", "w_out_in": ("b/kernel", (1, 0)), "gate": None,
             "fc.weight": "dense/kernel", "fc.bias": "dense/bias"}  # a renamed Linear keeps its transpose
    model = convert.load_flax(Custom(), params, names=names)
    assert np.array_equal(model.w_in_out.detach().numpy(), params["a"]["kernel"])
    assert np.array_equal(model.w_out_in.detach().numpy(), params["b"]["kernel"].T)
    assert np.array_equal(model.fc.weight.detach().numpy(), params["dense"]["kernel"].T)
    assert_same_tree(convert.to_flax(model, names=names), params)
    grads = convert.tensors_to_flax(model, {"gate": torch.ones(1), "w_out_in": torch.ones(5, 3)}, names=names)
    assert list(grads) == ["b/kernel"] and grads["b/kernel"].shape == (3, 5)
    with pytest.raises(convert.ConvertError, match=r"torch 'gate' \(Custom has no rule\) has no Flax name"):
        convert.load_flax(Custom(), params, names={k: v for k, v in names.items() if k != "gate"})


def builtin(cfg):
    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    flax_model = nnx.eval_shape(lambda: jax_models.build(cfg, dataset))  # its structure only: no init compiles
    return models.build(cfg, dataset), flax_model, init_for(init_key(cfg))  # init_for: cached for the session


@pytest.mark.parametrize("cfg", [BASE, GPT], ids=lambda c: c.model)
def test_builtin_models_map_as_the_flax_models(cfg):
    model, flax_model, init = builtin(cfg)
    model = convert.load_flax(model, init)
    names = convert.flax_names(model)  # its order: test_torch_models (the definition order, from a real NNX model)
    assert_same_tree(convert.to_flax(model), jax_models.unflatten_names(init))
    assert jax.tree.structure(convert.to_flax(model)) == jax.tree.structure(nnx.to_pure_dict(nnx.state(flax_model)))
    legacy = models.to_flax(dict(model.named_parameters()), models.flax_names(model))  # the wrappers agree
    assert_same_tree(legacy, convert.tensors_to_flax(model, dict(model.named_parameters())))
    if cfg.model == "mlp":
        assert list(names.items())[:2] == [("layers.0.weight", "layers/0/kernel"), ("layers.0.bias", "layers/0/bias")]


@pytest.mark.parametrize("wrap", [nn.DataParallel, torch.compile], ids=["data-parallel", "compiled"])
def test_wrapped_models_are_seen_through(wrap):
    params = flax_net_params(np.float64)
    wrapped = wrap(Net().double())
    prefix = "module." if wrap is nn.DataParallel else "_orig_mod."
    assert list(convert.flax_names(wrapped)) == [prefix + n for n in convert.flax_names(Net())]
    convert.load_flax(wrapped, params)
    assert_same_tree(convert.to_flax(wrapped), params)
    named = dict(convert.unwrap(wrapped)[0].named_parameters())
    assert_same_tree(convert.tensors_to_flax(wrapped, named),  # names without the wrapper's prefix too
                     convert.tensors_to_flax(wrapped, dict(wrapped.named_parameters())))


def test_fsdp2_shards_load_and_gather_exactly():
    from torch_ref.launch import launch

    params = flax_net_params(np.float64)
    per_rank = launch(fsdp2_round_trip, 2, params, platform="cpu", timeout_s=120, pg_timeout_s=60)
    for back, _ in per_rank:
        assert_same_tree(back, params)
    assert per_rank[0][1]["convs.1.weight"] == per_rank[1][1]["convs.1.weight"] == 4 * 4 * 3 * 3 // 2  # sharded


class Tied(nn.Module):
    """A tied weight (`head.weight` is `body.embed.weight`), a non-persistent buffer, an unknown layer."""

    def __init__(self, odd: bool = False):
        super().__init__()
        self.body = nn.ModuleDict({"embed": nn.Embedding(5, 3), "norm": nn.LayerNorm(3)})
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.body.embed.weight
        self.body.norm.register_buffer("cache", torch.zeros(3), persistent=False)
        self.odd = nn.Bilinear(2, 2, 1) if odd else None


def test_tied_weights_are_named_once_and_non_persistent_buffers_ignored():
    model = Tied()
    names = convert.flax_names(model, strip_prefix="body.")
    assert names == {"body.embed.weight": "embed/embedding", "body.norm.weight": "norm/scale",
                     "body.norm.bias": "norm/bias"}  # not head/kernel: the tied weight by its first path
    state = model.state_dict()  # both paths of the tied weight
    assert list(convert.tensors_to_flax(model, state, strip_prefix="body.")) == list(names.values())
    renamed = convert.flax_names(model, names={"head.weight": "wte"})  # an alias names the same tensor
    assert renamed["body.embed.weight"] == "wte" and "head.weight" not in renamed
    assert convert.flax_names(model, names={"body.norm.cache": "c"})["body.norm.cache"] == "c"  # only if asked
    with pytest.raises(convert.ConvertError, match=r"^2 tensor.*'odd.weight' \(Bilinear has no rule\).*'odd.bias'"):
        convert.flax_names(Tied(odd=True))  # an unknown layer: one error listing every tensor
    with pytest.raises(convert.ConvertError, match=r"strip_prefix='body' is not a module path ending in '.'"):
        convert.to_flax(model, strip_prefix="body")
