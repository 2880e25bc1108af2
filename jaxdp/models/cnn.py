"""`cnn`: conv 3x3 -> BatchNorm -> ReLU -> conv 3x3 -> BatchNorm -> ReLU -> global average pool ->
dense, on 8x8 single-channel images (the `digits` rows, reshaped NHWC; torch_ref/models/cnn.py is NCHW).
The convolutions have no bias by default, as is usual before BatchNorm: its mean subtraction cancels
a bias exactly, so a bias's gradient is rounding noise only, which Adam's normalisation turns into
updates that differ by O(1) relative between strategies (seen: 2.4 against `single`; absolute ~1e-16).
`conv_bias=True` (`--conv-bias true`) keeps them, as many users' models do: the parity judge's error
model (jaxdp/judge/error_model.py) accepts that noise as what it is, and the parity tests run it.

BatchNorm has torch's semantics, not Flax's defaults: normalisation with the biased batch variance,
eps 1e-5, running statistics updated as new = 0.9 old + 0.1 batch with the *unbiased* batch
variance. Under data parallelism (`mode`):
- `sync`: the batch statistics are over every device's rows of the micro-batch (a `pmean` over the
  `data` axis whenever the model runs inside one: shard_map or pmap), so every strategy computes
  what `single` does on the same micro-batch;
- `local`: each device normalises with its own rows' statistics (torch DDP's default).
The mean and variance are two-pass (mean first, then the mean squared deviation), as torch's CPU
kernel computes them; their gradient flows through the cross-device mean (its transpose is a sum
over devices, as in torch's SyncBatchNorm backward).

FSDP units (`unit_specs`, zero3): conv1 with bn1, conv2 with bn2 (and the pooling), the head. The
running statistics stay out of the units' parameters (`units.pure_units` holds them as they are).
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import nnx
from jax import lax

from ..core.run.config import ConfigError
from ..devices import AXIS
from . import given, loop_conv, units

EPS = 1e-5
MOMENTUM = 0.1  # torch's: new = (1 - 0.1) old + 0.1 batch
MODES = ("sync", "local")
IMAGE = (8, 8, 1)  # digits: 8x8, one channel (NHWC)


def data_axis_bound() -> bool:
    """True inside a shard_map / pmap over the `data` axis (where `sync` statistics need a pmean)."""
    try:
        lax.axis_size(AXIS)
    except NameError:
        return False
    return True


class BatchNorm(nnx.Module):
    """BatchNorm over N, H, W of NHWC inputs, torch's training-mode semantics (module docstring).
    Each call in training normalises with the batch statistics and updates `mean`/`var` (an
    `nnx.BatchStat`: `jaxdp.models.from_module` carries them outside the gradient)."""

    def __init__(self, channels: int, *, mode: str, param_dtype, dtype):
        if mode not in MODES:
            raise ValueError(f"batchnorm mode {mode!r}; valid: {', '.join(MODES)}")
        self.mode, self.dtype = mode, dtype
        self.scale = nnx.Param(jnp.ones(channels, param_dtype))
        self.bias = nnx.Param(jnp.zeros(channels, param_dtype))
        self.mean = nnx.BatchStat(jnp.zeros(channels, param_dtype))
        self.var = nnx.BatchStat(jnp.ones(channels, param_dtype))

    def __call__(self, x):
        axes = tuple(range(x.ndim - 1))
        stats_dtype = jnp.promote_types(x.dtype, jnp.float32)  # bf16 activations: statistics in fp32
        xs = x.astype(stats_dtype)
        xs, mean, var, count = self.statistics(xs, axes)
        new_mean = (1 - MOMENTUM) * self.mean[...] + MOMENTUM * mean
        new_var = (1 - MOMENTUM) * self.var[...] + MOMENTUM * var * (count / max(count - 1, 1))  # unbiased
        self.mean[...], self.var[...] = new_mean.astype(self.mean.dtype), new_var.astype(self.var.dtype)
        y = (xs - mean) * lax.rsqrt(var + EPS) * self.scale[...] + self.bias[...]
        return y.astype(self.dtype)

    def statistics(self, xs, axes):
        """(z, mean, biased variance, count) of the micro-batch: this device's rows, over the `data` axis
        (`sync`), or given (canonical: `given.given`, which may also give z, the input)."""
        record = given.current()
        if record is not None:
            if self.mode != "sync":
                raise ConfigError("reduction='canonical' needs sync BatchNorm: local statistics are per device, so "
                                  "they depend on N; use batchnorm='sync' (--batchnorm sync) or reduction='native'")
            return record.take(xs)
        sync = self.mode == "sync" and data_axis_bound()
        count = xs.size // xs.shape[-1] * (lax.axis_size(AXIS) if sync else 1)
        mean = xs.mean(axes)
        mean = lax.pmean(mean, AXIS) if sync else mean
        var = jnp.square(xs - mean).mean(axes)  # biased: what normalises
        var = lax.pmean(var, AXIS) if sync else var
        return xs, mean, var, count


class CNN(nnx.Module):
    """conv1 -> bn1 -> relu -> conv2 -> bn2 -> relu -> mean over H, W -> head (torch_ref/models/cnn.py's names)."""

    def __init__(self, channels, n_classes: int, *, batchnorm: str = "sync", conv_bias: bool = False,
                 param_dtype, dtype, rngs: nnx.Rngs):
        c1, c2 = channels
        kw = dict(param_dtype=param_dtype, dtype=dtype)
        conv = dict(padding="SAME", use_bias=conv_bias, rngs=rngs, conv_general_dilated=loop_conv.conv_general_dilated)
        self.conv1 = nnx.Conv(IMAGE[-1], c1, (3, 3), **conv, **kw)
        self.bn1 = BatchNorm(c1, mode=batchnorm, **kw)
        self.conv2 = nnx.Conv(c1, c2, (3, 3), **conv, **kw)
        self.bn2 = BatchNorm(c2, mode=batchnorm, **kw)
        self.head = nnx.Linear(c2, n_classes, rngs=rngs, **kw)

    def unit_specs(self) -> list[units.UnitSpec]:
        return [units.UnitSpec("block1", (("conv1",), ("bn1",)), first_block),
                units.UnitSpec("block2", (("conv2",), ("bn2",)), last_block),
                units.UnitSpec("head", (("head",),), head)]

    def __call__(self, x):
        return units.run(self, x)


def first_block(conv, bn, x):
    h = x.reshape(x.shape[0], *IMAGE).astype(conv.dtype or x.dtype)
    return nnx.relu(bn(conv(h)))


def last_block(conv, bn, h):
    return nnx.relu(bn(conv(h))).mean(axis=(1, 2))  # pooled here: the head's input (a residual) is small


def head(linear, h):
    return linear(h)
