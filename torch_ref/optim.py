"""torch.optim as a user writes it, for `--optimizer`: SGD, SGD(momentum=0.9), Adam, AdamW, and
torch.nn.utils.clip_grad_norm_. The JAX side (`jaxdp.optim`) is written to match these."""
from __future__ import annotations

import torch

MOMENTUM = 0.9
ADAM = dict(betas=(0.9, 0.999), eps=1e-8)


def optimizer_class(cfg) -> tuple[type[torch.optim.Optimizer], dict]:
    """The torch.optim class and its keyword arguments for `cfg` (ZeroRedundancyOptimizer wants
    them apart). Weight decay is always passed: coupled for SGD/Adam, decoupled for AdamW. `--kernels fused`:
    torch's fused implementation (`fused=True`, one kernel over all parameters, on CPU as on CUDA)."""
    kw = dict(lr=cfg.lr, weight_decay=cfg.weight_decay)
    if getattr(cfg, "kernels", "mirrored") == "fused":
        kw["fused"] = True
    if cfg.optimizer == "sgd":
        return torch.optim.SGD, kw
    if cfg.optimizer == "momentum":
        return torch.optim.SGD, dict(kw, momentum=MOMENTUM)
    if cfg.optimizer == "adam":
        return torch.optim.Adam, dict(kw, **ADAM)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW, dict(kw, **ADAM)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}; valid: sgd, momentum, adam, adamw")


def make(cfg, params) -> torch.optim.Optimizer:
    cls, kw = optimizer_class(cfg)
    return cls(params, **kw)


def clip_(params, max_norm: float):
    """torch.nn.utils.clip_grad_norm_ when `--clip-norm` > 0 (coef = max_norm / (norm + 1e-6), at most 1)."""
    if max_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, max_norm)


def factory(cfg):
    """`cfg`'s optimizer as `torch_ref.parallelize` takes it: a callable from parameters to the optimizer."""
    return lambda params: make(cfg, params)
