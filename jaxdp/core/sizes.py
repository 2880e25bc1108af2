"""A run's bytes per device, from the model's shapes alone: arithmetic on `RunConfig`, nothing allocated,
no framework loaded (docs/RELIABILITY.md, "Sizes checked before work").

`parameters(cfg)` counts the built-in model's parameters exactly (tests/jaxdp/core/test_sizes.py holds it
to the models' own counts) by the count its model's registry row names (jaxdp/core/registry/models.py; a
model the registry does not hold is refused, never counted as another); `estimate(cfg)` lays them out as
the strategy does (its registry row's `shards`, as the ZeRO rows of jaxdp/strategies/zero/layout.py and
jit/layout.py say) and adds the activations that
one micro-batch keeps for the backward pass and the global batch NumPy builds on the host. The estimate
is a lower bound (the layers' saved outputs only, no workspace), so what it refuses cannot fit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import data
from .registry import models, strategies
from .registry.strategies import load

STATE_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}  # optimizer arrays per parameter
OPTIMIZER_NAMES = {"sgd": "SGD", "momentum": "momentum", "adam": "Adam", "adamw": "AdamW"}
MASTER_BYTES = {"float64": 8, "float32": 4, "bfloat16": 4}  # parameters, gradients, state: fp32 under bf16
COMPUTE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2}
IMAGE_PIXELS = 64  # cnn: the 8x8 digits


def classes(cfg) -> tuple[int, int]:
    """(input width, classes or vocabulary) of `cfg`'s data, as `jaxdp.core.data.load` makes them."""
    if cfg.data == "synthetic":
        return data.SYNTHETIC_FEATURES, data.SYNTHETIC_CLASSES
    if cfg.data == "digits":
        return IMAGE_PIXELS, 10
    if cfg.data in data.TOKEN_VOCABS:
        return cfg.seq_len, data.TOKEN_VOCABS[cfg.data]
    return cfg.seq_len, len(set(data.text_corpus()))


def _dense(d_in: int, d_out: int, bias: bool = True) -> int:
    return d_in * d_out + (d_out if bias else 0)


def parameters(cfg) -> int:
    """The number of trained parameters of `cfg`'s built-in model (jaxdp/models/), by its registry row's
    count; a model the registry does not hold is refused (`ConfigError` naming --model), never estimated."""
    return load(models.entry(cfg.model).parameters)(cfg, *classes(cfg))


def activations_per_row(cfg) -> tuple[int, int]:
    """(elements in the compute dtype, float32 elements) one sample keeps for the backward pass: the layers'
    outputs, each attention's weights (heads x T x T), the logits and their float32 softmax. Set against
    XLA's compiled peak (`memory_analysis`, docs/RELIABILITY.md) it stays below it, as a lower bound must."""
    return load(models.entry(cfg.model).activations)(cfg, *classes(cfg))


# ---- each model's theory, named by its row in jaxdp/core/registry/models.py: (cfg, width, vocab) ------------
def mlp_parameters(cfg, width: int, vocab: int) -> int:
    sizes = (width, *cfg.hidden, vocab)
    return sum(_dense(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True))


def cnn_parameters(cfg, width: int, vocab: int) -> int:
    c1, c2 = cfg.channels
    bias = bool(cfg.conv_bias)
    return _dense(9, c1, bias) + 2 * c1 + _dense(9 * c1, c2, bias) + 2 * c2 + _dense(c2, vocab)


def gpt_parameters(cfg, width: int, vocab: int) -> int:
    """No qkv bias, an untied head."""
    d, t, n = cfg.d_model, cfg.seq_len, cfg.n_layer
    block = 4 * d + _dense(d, 3 * d, False) + _dense(d, d) + _dense(d, 4 * d) + _dense(4 * d, d)
    return vocab * d + t * d + n * block + 2 * d + _dense(d, vocab)


def gpt2_parameters(cfg, width: int, vocab: int) -> int:
    """The head is wte (tied)."""
    d, t, n = cfg.d_model, cfg.seq_len, cfg.n_layer
    block = 4 * d + _dense(d, 3 * d) + _dense(d, d) + _dense(d, 4 * d) + _dense(4 * d, d)
    return vocab * d + t * d + n * block + 2 * d


def llama_parameters(cfg, width: int, vocab: int) -> int:
    """RMSNorm scales only, no bias, an untied head."""
    d, n = cfg.d_model, cfg.n_layer
    kv = cfg.kv_heads() * (d // cfg.n_head)
    block = 2 * d + 2 * d * d + 2 * d * kv + 3 * d * cfg.ffn_width()
    return vocab * d + n * block + d + d * vocab


def mlp_activations(cfg, width: int, vocab: int) -> tuple[int, int]:
    """XLA fuses each ReLU into its matmul: one array per layer."""
    return width + sum(cfg.hidden) + vocab, 0


def cnn_activations(cfg, width: int, vocab: int) -> tuple[int, int]:
    return IMAGE_PIXELS * (1 + 3 * sum(cfg.channels)) + vocab, vocab


def _decoder(cfg, vocab: int, layer: int) -> tuple[int, int]:
    t, d = cfg.seq_len, cfg.d_model
    return t * (cfg.n_layer * layer + 2 * d + vocab), t * vocab


def gpt_activations(cfg, width: int, vocab: int) -> tuple[int, int]:
    """gpt, gpt2: ln_1 in/out, qkv, attention out, ln_2 in/out, fc, gelu: 16 d per layer."""
    return _decoder(cfg, vocab, 16 * cfg.d_model + cfg.n_head * cfg.seq_len)


def llama_activations(cfg, width: int, vocab: int) -> tuple[int, int]:
    """Norms in/out, q k v, rotated q k, attention out, gate, up, their product."""
    d, h = cfg.d_model, cfg.n_head
    kv = cfg.kv_heads() * (d // h)
    return _decoder(cfg, vocab, 7 * d + 3 * kv + 3 * cfg.ffn_width() + h * cfg.seq_len)


def batch_bytes(cfg) -> int:
    """The global batch NumPy builds on the host each step (float64 inputs; token windows and their two
    int32 slices)."""
    width, vocab = classes(cfg)
    if cfg.data in ("text", *data.TOKEN_VOCABS):
        return cfg.batch_size * (cfg.seq_len + 1) * 4 * 3
    return cfg.batch_size * (width + vocab) * 8


@dataclass(frozen=True)
class Estimate:
    """Bytes per device (parameters, gradients, optimizer state, activations) and on the host (the batch)."""
    params: int
    grads: int
    opt_state: int
    activations: int
    batch: int
    optimizer: str

    @property
    def per_device(self) -> int:
        return self.params + self.grads + self.opt_state + self.activations

    def parts(self) -> str:
        """'parameters 0.5 GiB, AdamW state 1.0 GiB, gradients 0.5 GiB, activations 88 GiB' (per device)."""
        named = [("parameters", self.params), (f"{OPTIMIZER_NAMES[self.optimizer]} state", self.opt_state),
                 ("gradients", self.grads), ("activations", self.activations)]
        return ", ".join(f"{name} {human(b)}" for name, b in named if b)


def shard_count(cfg) -> int:
    """How many devices share one copy of a sharded part: N, a grid strategy's (hsdp's) group of N / R."""
    return cfg.devices // cfg.replicas if strategies.get(cfg.strategy, "grid") else cfg.devices


def estimate(cfg) -> Estimate:
    """`cfg`'s bytes per device and on the host, as its strategy lays them out (its registry row's `shards`;
    a name the registry does not hold: a full copy)."""
    psi, item = parameters(cfg), MASTER_BYTES[cfg.dtype]
    params, grads, state = strategies.get(cfg.strategy, "shards", (False, False, False))
    n = shard_count(cfg)

    def part(elements: int, sharded: bool) -> int:
        return (math.ceil(elements / n) if sharded else elements) * item

    rows = cfg.batch_size // max(1, cfg.devices * cfg.accum)
    compute, fp32 = activations_per_row(cfg)
    return Estimate(part(psi, params), part(psi, grads), part(STATE_SLOTS[cfg.optimizer] * psi, state),
                    rows * (compute * COMPUTE_BYTES[cfg.dtype] + fp32 * 4), batch_bytes(cfg), cfg.optimizer)


def human(n: float) -> str:
    """Bytes in words: '512 B', '3.2 MiB', '48 GiB', '2.4e+03 TiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            text = f"{n:.1f}" if n < 10 and unit != "B" else f"{n:.0f}" if n < 1e5 else f"{n:.1e}"
            return f"{text} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
