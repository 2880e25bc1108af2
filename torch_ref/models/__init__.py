"""The torch mirrors of `jaxdp.models`, one file each (mlp.py, gpt.py, gpt2.py, llama.py, cnn.py, as
jaxdp/models/), the registry that builds them (`build`), the loss, and the bridge to the Flax parameters.

The modules are registered in the Flax models' definition order, so `parameters()` follows
`jaxdp.models.definition_order` (bucketed all-reduce relies on that order). They are initialised
from the JAX side's parameters (`load_flax`), never from torch's own init, so both frameworks start
bit-identical; `to_flax` converts back to trace names and layouts (a Linear weight [out, in] is the
Flax kernel [in, out]).
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from jaxdp.core.registry import models as registry

from .. import convert
from .gpt import GPT
from .gpt2 import GPT2
from .llama import Llama
from .mlp import MLP

MASTER_DTYPE = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.float32}
COMPUTE_DTYPE = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def numpy_master_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype of the master parameters (and of the float inputs) for `--dtype`."""
    return np.dtype(str(MASTER_DTYPE[dtype]).removeprefix("torch."))


def build(cfg, dataset) -> nn.Module:
    """The torch model of `cfg` in its master dtype (parameters still torch's: call `load_flax`); the
    transformers' attention as `cfg.kernels` says (`attention.py`)."""
    kernels = getattr(cfg, "kernels", "mirrored")
    registry.entry(cfg.model)  # a model the registry does not hold: one line naming --model and the known ones
    if cfg.model == "mlp":
        model = MLP((dataset.n_features, *cfg.hidden, dataset.n_classes))
    elif cfg.model == "gpt":
        model = GPT(vocab=dataset.n_classes, seq_len=cfg.seq_len, n_layer=cfg.n_layer, n_head=cfg.n_head,
                    d_model=cfg.d_model, kernels=kernels)
    elif cfg.model == "cnn":
        from .cnn import CNN

        model = CNN(cfg.channels, dataset.n_classes, cfg.batchnorm, cfg.conv_bias)
    elif cfg.model == "gpt2":
        model = GPT2(vocab=dataset.n_classes, seq_len=cfg.seq_len, n_layer=cfg.n_layer, n_head=cfg.n_head,
                     d_model=cfg.d_model, kernels=kernels)
    elif cfg.model == "llama":
        model = Llama(vocab=dataset.n_classes, seq_len=cfg.seq_len, n_layer=cfg.n_layer, n_head=cfg.n_head,
                      n_kv_head=cfg.kv_heads(), d_model=cfg.d_model, d_ff=cfg.ffn_width(), kernels=kernels)
    else:
        raise AssertionError(f"registered model {cfg.model!r} has no branch here")
    return model.to(MASTER_DTYPE[cfg.dtype])


def loss_fn(model, x, y, dtype: str):
    """Mean softmax cross-entropy over every row (and position) of `x`. bfloat16 runs compute under
    CPU/CUDA autocast with fp32 master parameters; the loss is taken in fp32 from bf16 logits."""
    autocast = (torch.autocast(x.device.type, dtype=torch.bfloat16) if dtype == "bfloat16"
                else contextlib.nullcontext())
    with autocast:
        logits = model(x)
    logits = logits.float() if logits.dtype == torch.bfloat16 else logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


# ---- Flax names and layouts (the general mapping lives in torch_ref.convert) ----------------------
def flax_names(model: nn.Module) -> dict[str, tuple[str, tuple[int, ...] | None]]:
    """{torch name: (Flax name, layout)} in `parameters()` order (then mapped buffers), e.g.
    'layers.0.weight' -> ('layers/0/kernel', (1, 0)): layout is the torch -> Flax axis permutation,
    None where the layouts agree (truthy exactly where a transpose is needed)."""
    return {name: tuple(m) for name, m in convert.mapping(model).items()}


def to_flax(tensors: dict[str, torch.Tensor], names: dict[str, tuple]) -> dict[str, np.ndarray]:
    """Torch-named full tensors -> Flax-named NumPy arrays in Flax layout (Linear weights transposed)."""
    return {names[name][0]: convert.flax_array(t, names[name][1]) for name, t in tensors.items()}


def load_flax(model: nn.Module, flat: dict[str, np.ndarray]) -> nn.Module:
    """Copy Flax-named NumPy parameters (from `jaxdp.models.init`) into `model`, bit for bit."""
    return convert.load_flax(model, flat)
