"""`zero3` (alias `fsdp`): FSDP2, `torch.distributed.fsdp.fully_shard`, on each unit and the root.

The units are jaxdp's (`jaxdp.models.units`): each MLP layer; for the GPT the two embeddings as one
group, each block, and the final LayerNorm with the head as one group, so the root owns no
parameter of its own. Every parameter becomes a DTensor sharded along dim 0 over a 1-D device mesh
(a CPU mesh with gloo, a CUDA mesh with NCCL); parameters, gradients and optimizer state are all 1/N
per rank. Each unit's parameters are all-gathered just before its forward and freed after it, and
with `reshard_after_forward=True` (FSDP2's name, `--reshard-after-forward`) all-gathered again
before its backward (False keeps them from forward to backward); its gradients are reduce-scattered
as soon as backward has produced them. FSDP2 scales
the gradients by 1/N itself. Accumulation turns gradient sync off (`set_requires_gradient_sync`)
for every micro-batch but the last: unsharded gradients accumulate locally and are reduce-scattered
once per step. torch.nn.utils.clip_grad_norm_ on DTensor gradients computes the whole norm.
"""
from __future__ import annotations

import contextlib

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from .. import optim
from ..checkpoint import ModelOptimizer
from .common import Strategy, apply_update, local_grads, mean_over_ranks, metrics


def units_of(model) -> list[list]:
    """The groups FSDP shards one by one, in forward order (jaxdp's units): the MLP's Linear layers;
    the GPT's embeddings, blocks, and final LayerNorm with the head."""
    if hasattr(model, "blocks"):
        return [[model.tok_embed, model.pos_embed], *([b] for b in model.blocks), [model.ln_f, model.head]]
    return [[layer] for layer in model.layers]


def apply_fsdp(model, reshard_after_forward: bool = True):
    device_type = next(model.parameters()).device.type
    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    for unit in units_of(model):
        fully_shard(unit if len(unit) > 1 else unit[0], mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh)  # the root: no parameters of its own left
    return model


@contextlib.contextmanager
def no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def make(model, cfg, return_grads: bool) -> Strategy:
    model = apply_fsdp(model, cfg.reshard_after_forward)
    optimizer = optim.make(cfg, model.parameters())  # over the local shards: 1/N of the state

    def step(x, y):
        loss = local_grads(model, x, y, cfg, no_sync=lambda: no_sync(model))
        loss = mean_over_ranks(loss)
        grads = ({name: p.grad.full_tensor() for name, p in model.named_parameters()}  # all-gather, tracing only
                 if return_grads else None)
        apply_update(model, optimizer, cfg.clip_norm)
        return metrics(loss, grads)

    def full_params():  # a collective: every rank calls it
        return {name: p.full_tensor().detach() for name, p in model.named_parameters()}

    return Strategy(
        "zero3", step, full_params, wrapped=model, checkpoint=ModelOptimizer(model, optimizer)
    )  # DTensors: saved shard by shard
