"""`zero3` (alias `fsdp`): FSDP2, `torch.distributed.fsdp.fully_shard`, on each unit and the root.

The units are `units=` (submodules, or lists of submodules sharded as one group), by default jaxdp's
for its models (`jaxdp.models.units`): each MLP layer; for the GPT the two embeddings as one group,
each block, and the final LayerNorm with the head as one group; for the CNN each convolution with its
BatchNorm, then the head (the root owns no parameter of its own); for any other model each direct
child that owns parameters, then the root. Every parameter
becomes a DTensor sharded along dim 0 over a 1-D device mesh (a CPU mesh with gloo, a CUDA mesh with
NCCL); parameters, gradients and optimizer state are all 1/N per rank. Each unit's parameters are
all-gathered just before its forward and freed after it, and with `reshard_after_forward=True`
(FSDP2's name, `--reshard-after-forward`) all-gathered again before its backward (False keeps them
from forward to backward); its gradients are reduce-scattered as soon as backward has produced them.
FSDP2 scales the gradients by 1/N itself. Accumulation turns gradient sync off
(`set_requires_gradient_sync`) for every micro-batch but the last: unsharded gradients accumulate
locally and are reduce-scattered once per step. torch.nn.utils.clip_grad_norm_ on DTensor gradients
computes the whole norm.
"""
from __future__ import annotations

import contextlib

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from jaxdp.core.config import ConfigError

from .. import cnn, gpt2, models
from .common import Parallel, make_parallel


def units_of(model) -> list[list]:
    """The groups FSDP shards one by one by default, in forward order: for jaxdp's models its units
    (the MLP's Linear layers; the GPT's embeddings, blocks, and final LayerNorm with the head); for
    any other model each direct child that owns parameters."""
    if isinstance(model, models.GPT):
        return [[model.tok_embed, model.pos_embed], *([b] for b in model.blocks), [model.ln_f, model.head]]
    if isinstance(model, gpt2.GPT2):  # the tied wte in no unit: the root's (gathered once per step)
        return gpt2.fsdp_units(model)
    if isinstance(model, models.MLP):
        return [[layer] for layer in model.layers]
    if isinstance(model, cnn.CNN):  # conv + BatchNorm as one group, twice, then the head
        return cnn.fsdp_units(model)
    return [[child] for child in model.children() if any(True for _ in child.parameters())]


def apply_fsdp(model, reshard_after_forward: bool = True, units=None):
    """fully_shard each unit (a submodule, or a list of submodules sharded as one group), then the root."""
    units = [list(u) if isinstance(u, (list, tuple)) else [u] for u in (units_of(model) if units is None else units)]
    own = {id(m) for m in model.modules()}
    foreign = [type(m).__name__ for unit in units for m in unit if id(m) not in own or m is model]
    if foreign:
        raise ConfigError(f"units= holds {', '.join(foreign)}, not a submodule of the model being parallelized; "
                          f"pass its own submodules (the root is sharded last by itself)")
    device_type = next(model.parameters()).device.type
    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    for unit in units:
        fully_shard(unit if len(unit) > 1 else unit[0], mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh)  # the root: whatever parameters no unit took
    return model


@contextlib.contextmanager
def no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def make(model, optimizer, opts) -> Parallel:
    model = apply_fsdp(model, opts.reshard_after_forward, opts.units)
    built = optimizer(model.parameters())  # over the local shards: 1/N of the state

    def full_grads():  # all-gather, tracing only
        return {name: p.grad.full_tensor().clone() for name, p in model.named_parameters()}  # (N = 1: not an alias)

    def full_params():  # a collective: every rank calls it
        return {name: p.full_tensor().detach() for name, p in model.named_parameters()}

    # DTensors: the checkpoint saves them shard by shard
    return make_parallel("zero3", model, model, built, opts.accum, no_sync=lambda: no_sync(model),
                      full_grads=full_grads, full_params=full_params, wrapped=model)
