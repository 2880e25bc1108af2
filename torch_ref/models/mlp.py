"""The torch twin of jaxdp/models/mlp.py."""
from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """Linear layers with tanh between them and none after the last (jaxdp/models/mlp.py)."""

    def __init__(self, sizes):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=False)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.tanh(x)
        return x
