"""`cnn` in torch (NCHW), the mirror of jaxdp/models/cnn.py: conv1 -> bn1 -> relu -> conv2 -> bn2 ->
relu -> mean over H, W -> head; initialised from the JAX side's bits (`torch_ref.convert`: a Conv2d
weight [O, I, kh, kw] is the Flax kernel [kh, kw, I, O]; BatchNorm running_mean / running_var are
the Flax `mean` / `var`). No bias in the convolutions unless `conv_bias` (BatchNorm cancels it: jaxdp/models/cnn.py).
zero3 shards it by jaxdp's units (`fsdp_units`)."""
from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from ..batchnorm import BatchNorm2d

IMAGE = (1, 8, 8)  # digits: one channel, 8x8 (NCHW)


class CNN(nn.Module):
    def __init__(self, channels, n_classes: int, batchnorm: str = "sync", conv_bias: bool = False):
        super().__init__()
        c1, c2 = channels
        sync = batchnorm == "sync"
        self.conv1 = nn.Conv2d(IMAGE[0], c1, 3, padding=1, bias=conv_bias)
        self.bn1 = BatchNorm2d(c1, sync)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1, bias=conv_bias)
        self.bn2 = BatchNorm2d(c2, sync)
        self.head = nn.Linear(c2, n_classes)

    def forward(self, x):
        h = x.reshape(x.shape[0], *IMAGE)
        h = F.relu(self.bn1(self.conv1(h)))
        h = F.relu(self.bn2(self.conv2(h)))
        return self.head(h.mean(dim=(2, 3)))


def fsdp_units(model: CNN) -> list[list]:
    """FSDP2 groups, jaxdp's units (jaxdp/models/cnn.py `unit_specs`): conv1 with bn1, conv2 with bn2,
    the head; the root owns no parameter. (BatchNorm's running statistics are buffers: not sharded.)"""
    return [[model.conv1, model.bn1], [model.conv2, model.bn2], [model.head]]


def for_device(model: nn.Module, device) -> nn.Module:
    """On a GPU, `sync` BatchNorm as nn.SyncBatchNorm (its kernels; it refuses CPU tensors)."""
    if device.type == "cuda" and any(getattr(m, "sync", False) for m in model.modules()):
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model
