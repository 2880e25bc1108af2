"""`zero3` (alias `fsdp`): FSDP2, `torch.distributed.fsdp.fully_shard`, on each unit and the root.

Layout (torch's, not jaxdp's): every parameter a DTensor sharded along dim 0 (FSDP2's: chunks of
ceil(rows / N) rows, the last ones short or empty); jaxdp pads and shards each parameter flat.

The units are `units=` (submodules, or lists of submodules sharded as one group), by default jaxdp's
for its models (`jaxdp.models.units`): each MLP layer; for the GPT the two embeddings as one group,
each block, and the final LayerNorm with the head as one group; for the CNN each convolution with its
BatchNorm, then the head (the root owns no parameter of its own); for any other model each block of
its outermost `nn.ModuleList`s (HF GPT-2's `transformer.h`, Llama's `model.layers`), else each direct
child that owns parameters, then the root; a parameter shared by two units (a tied head) is left to
the root, and `units=` that split one are an error (`torch_ref/models/units.py`). Every parameter
becomes a DTensor sharded along dim 0 over a 1-D device mesh (a CPU mesh with gloo, a CUDA mesh with
NCCL); parameters, gradients and optimizer state are all 1/N per rank. Each unit's parameters are
all-gathered just before its forward and freed after it, and with `reshard_after_forward=True`
(FSDP2's name, `--reshard-after-forward`) all-gathered again before its backward (False keeps them
from forward to backward); its gradients are reduce-scattered as soon as backward has produced them.
FSDP2 scales the gradients by 1/N itself. Accumulation turns gradient sync off
(`set_requires_gradient_sync`) for every micro-batch but the last: unsharded gradients accumulate
locally and are reduce-scattered once per step. torch.nn.utils.clip_grad_norm_ on DTensor gradients
computes the whole norm.

Canonical: FSDP2's own forward and backward per shard. One shard a step: each unit's reduce-scatter
replaced by the canonical one (`install_units`, `canonical.UnitReduce`). Several (S > N, or accumulation):
every unit gathered once, by the first shard's forward, and held to the last backward, FSDP2's gradient
sync off (its post-backward reduces nothing: FSDP2's per-unit reduce per shard cost 1.1x of the gpt's
step at N = 1), each shard's unsharded gradients moved out of `.grad` and folded, then the canonical
reduce-scatter of FSDP2's layout (`canonical_grads`); clipping by the canonical norm of the gathered
gradient. With BatchNorm, FSDP2 cannot run canonical_bn's many passes over one graph: they run on a
plain twin of the model (a deepcopy taken before FSDP2 shards it) holding the gathered parameters (one
all-gather per parameter per step), and `canonical_grads` gives the DTensor gradients.
"""
from __future__ import annotations

import contextlib
import copy
import functools

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from jaxdp.core.run.config import ConfigError
from jaxdp.core.run.hsdp_hosts import grid_order

from ... import models
from ...canonical import batchnorm as canonical_bn
from ...canonical import reduce as C
from ...canonical import step as canonical_step
from ...canonical.folds import OwnedList
from ...models import cnn, gpt2, llama
from ...models import units as shared_units
from .. import common
from ..common import Strategy, make_strategy


def units_of(model) -> list[list]:
    """The groups FSDP shards one by one by default, in forward order: for jaxdp's models its units
    (the MLP's Linear layers; the GPT's embeddings, blocks, and final LayerNorm with the head); for
    any other model each block of its `nn.ModuleList`s (a model library's decoder layers), else each
    direct child that owns parameters, with every shared parameter left to the root (`models/units.py`)."""
    if isinstance(model, models.GPT):
        return [[model.tok_embed, model.pos_embed], *([b] for b in model.blocks), [model.ln_f, model.head]]
    if isinstance(model, gpt2.GPT2):  # the tied wte in no unit: the root's (gathered once per step)
        return gpt2.fsdp_units(model)
    if isinstance(model, llama.Llama):  # embed_tokens, each decoder layer, norm with lm_head
        return llama.fsdp_units(model)
    if isinstance(model, models.MLP):
        return [[layer] for layer in model.layers]
    if isinstance(model, cnn.CNN):  # conv + BatchNorm as one group, twice, then the head
        return cnn.fsdp_units(model)
    return shared_units.without_shared(model, shared_units.blocks(model))


def apply_fsdp(model, reshard_after_forward: bool = True, units=None, replicas: int | None = None,
               hosts: str = "shard", mp_policy=None):
    """fully_shard each unit (a submodule, or a list of submodules sharded as one group), then the root,
    over a 1-D mesh of every rank, or (`replicas` R given: hsdp) FSDP2's 2-D mesh (R, S) named
    ("replicate", "shard"), its rows in `hosts` order (`jaxdp.core.run.hsdp_hosts.grid_order`); `mp_policy`: FSDP2's
    MixedPrecisionPolicy on every unit and the root (None: FSDP2's default, none). Units given
    that split a shared parameter between groups are an error,
    before any collective."""
    given = units is not None
    units = [list(u) if isinstance(u, (list, tuple)) else [u] for u in (units if given else units_of(model))]
    own = {id(m) for m in model.modules()}
    foreign = [type(m).__name__ for unit in units for m in unit if id(m) not in own or m is model]
    if foreign:
        raise ConfigError(f"units= holds {', '.join(foreign)}, not a submodule of the model being parallelized; "
                          f"pass its own submodules (the root is sharded last by itself)")
    if given:
        shared_units.check_shared(model, units)
    device_type = next(model.parameters()).device.type
    world = dist.get_world_size()
    mesh = (init_device_mesh(device_type, (world,)) if replicas is None else
            init_device_mesh(device_type, (replicas, world // replicas), mesh_dim_names=("replicate", "shard"))
            if hosts == "shard" else DeviceMesh(device_type, torch.tensor(grid_order(world, replicas, hosts)),
                                                mesh_dim_names=("replicate", "shard")))
    policy = {} if mp_policy is None else {"mp_policy": mp_policy}
    for unit in units:
        fully_shard(unit if len(unit) > 1 else unit[0], mesh=mesh, reshard_after_forward=reshard_after_forward,
                    **policy)
    fully_shard(model, mesh=mesh, **policy)  # the root: whatever parameters no unit took
    return model


def make(model, optimizer, opts, name: str = "zero3", replicas: int | None = None, hosts: str = "shard") -> Strategy:
    """zero3 (or, with `replicas`, hsdp: `hsdp.py`) on `model`, with the optimizer factory `optimizer`."""
    twin = twin_of(model) if opts.reduction == "canonical" else None  # before FSDP2 shards the model
    model = apply_fsdp(model, opts.reshard_after_forward, opts.units, replicas, hosts, opts.mp_policy)
    built = optimizer(model.parameters())  # over the local shards: 1/N of the state

    def full_grads():  # all-gather, tracing only
        return {name: p.grad.full_tensor().clone() for name, p in model.named_parameters()}  # (N = 1: not an alias)

    def full_params():  # a collective: every rank calls it
        return {name: p.full_tensor().detach() for name, p in model.named_parameters()}

    # DTensors: the checkpoint saves them shard by shard
    return make_strategy(name, model, model, built, opts.accum,
                         no_sync=lambda: common.no_sync(model.set_requires_gradient_sync),
                         full_grads=full_grads, full_params=full_params, wrapped=model,
                         canonical_parts=CANONICAL._replace(twin=twin, backward=functools.partial(
                             backward, reshard_after_forward=opts.reshard_after_forward)))


def twin_of(model: torch.nn.Module) -> torch.nn.Module | None:
    """Canonical with BatchNorm: a plain copy of the model taken before FSDP2 shards it (`backward_bn` runs
    the per-shard passes on it with the gathered parameters); otherwise None."""
    return copy.deepcopy(model) if canonical_bn.batchnorms(model) else None


def install_units(c) -> None:
    """Canonical without BatchNorm and one shard a step, on the first step: every FSDP2 unit's reduce-scatter
    and all-reduce hook replaced by a `UnitReduce` (with BatchNorm, or several shards, FSDP2 reduces nothing)."""
    if c.bn is not None or c.par.accum * c.local > 1:  # (several shards: `gathered_backward`, no FSDP2 reduction)
        return
    c.units, columns = [], shard_columns(c.par.model)
    for module in c.par.model.modules():
        if isinstance(module, FSDPModule):
            unit = C.UnitReduce(c.local, c.par.accum, c.s, columns)
            module.set_custom_reduce_scatter(unit)
            module.set_all_reduce_hook(unit.hook)
            if c.world > 1:  # FSDP2 divides by nothing: the tree's /S and /A are all (at a world of one it
                module.set_gradient_divide_factor(1.0)  # divides by nothing unless given a factor, even 1.0)
            c.units.append(unit)


def shard_columns(model) -> list[int] | None:
    """hsdp: each rank's column on the (replicate, shard) mesh (the chunk of a unit's gradient it holds);
    zero3 (a 1-D mesh): None, rank d holds chunk d."""
    mesh = next(model.parameters()).device_mesh.mesh
    if mesh.dim() == 1:
        return None
    columns = [0] * mesh.numel()
    for (_, s), rank in zip(torch.cartesian_prod(*map(torch.arange, mesh.shape)).tolist(), mesh.reshape(-1).tolist(),
                            strict=True):
        columns[rank] = s
    return columns


def backward(c, x, y, loss_fn, reshard_after_forward: bool = True) -> torch.Tensor:
    """Canonical: one shard a step (`one_backward`: FSDP2's backward, its reduce-scatter a `UnitReduce`), or
    several (`gathered_backward`: every unit gathered once, FSDP2's backward with its reduction off, each
    shard's unsharded gradient folded here, the canonical reduce-scatter into FSDP2's layout after the last)."""
    if c.par.accum * c.local == 1:
        return one_backward(c, x, y, loss_fn)
    return gathered_backward(c, x, y, loss_fn, reshard_after_forward)


def one_backward(c, x, y, loss_fn) -> torch.Tensor:
    """The step's only shard through FSDP2 as native runs it (each unit gathered for its forward and its
    backward as `reshard_after_forward` says), its reduce-scatter the canonical one (`install_units`)."""
    losses = C.Folds(1)
    for _, i, xs, ys in C.shards_of(x, y, 1, 1):
        loss = C.scalar(loss_fn(c.par.model(xs), ys))
        loss.backward()
        losses.add(i, loss.detach())
    return losses.partial()


def gathered_backward(c, x, y, loss_fn, reshard_after_forward: bool) -> torch.Tensor:
    """Several shards: every unit gathered by the first shard's forward and held to the end (`held_gathered`);
    each shard's backward through FSDP2 with gradient sync off (no reduce-scatter, no all-reduce: FSDP2's
    per-unit post-backward reduces nothing) leaves the unsharded gradients, which are folded here (`Folds`, the
    definition's association); after the last, every unit resharded and `canonical_grads` (the tree's
    reduce-scatter of FSDP2's layout) gives the DTensor gradients."""
    model = c.par.model
    grads, losses = C.Folds(c.local, c.par.accum), C.Folds(c.local, c.par.accum)
    with held_gathered(model, reshard_after_forward):
        for _, i, xs, ys in C.shards_of(x, y, c.par.accum, c.local):
            loss = C.scalar(loss_fn(model(xs), ys))
            loss.backward()
            # unsharded while held; `.grad` itself: `apply_fsdp` gives FSDP2 no MixedPrecisionPolicy, whose reduce
            # dtype would have FSDP2 move each gradient out of `.grad` into an accumulator of its own
            grads.add(i, OwnedList(taken(p) for p in model.parameters()))
            losses.add(i, loss.detach())
    canonical_grads(c, grads.partial())
    return losses.partial()


def taken(p: torch.Tensor) -> torch.Tensor:
    """p's gradient, moved out of `.grad` (zeros where the loss does not reach p)."""
    g = torch.zeros_like(p) if p.grad is None else p.grad
    p.grad = None
    return g


@contextlib.contextmanager
def held_gathered(model, reshard_after_forward: bool):
    """Within: no unit reshards after its forward or backward (each is all-gathered once, by the first
    shard's forward) and FSDP2 reduces no gradient. After: every unit resharded, FSDP2's reduction on again,
    each unit resharding after forward as `reshard_after_forward` says and after backward, the root never
    (FSDP2's own defaults)."""
    model.set_reshard_after_forward(False)
    model.set_reshard_after_backward(False)
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
        model.set_requires_gradient_sync(True)
        model.set_reshard_after_backward(True)
        model.set_reshard_after_forward(reshard_after_forward)
        model.set_reshard_after_forward(False, recurse=False)


def backward_bn(c, x, y, loss_fn) -> torch.Tensor:
    """Canonical with BatchNorm: the gathered parameters into the twin (a collective: every parameter
    gathered once per step), then `canonical_bn`'s passes on it and `canonical_grads`."""
    full = c.par.full_params()
    with torch.no_grad():
        for name, p in c.parts.twin.named_parameters():
            p.copy_(full[name])
    return canonical_step.bn_backward(c, x, y, loss_fn, c.parts.twin)


def canonical_grads(c, grads: torch.Tensor) -> None:
    """Several shards, or BatchNorm: the canonical reduce-scatter of FSDP2's layout (each parameter's dim-0
    chunks of ceil(rows / K) over the K ranks of the mesh's shard dimension, rank-major, as its reduce-scatter
    takes them; hsdp: rank d gets its column's chunk) of `grads`, this rank's flat partial sums (a buffer of the
    step's own): this rank's chunks, finished in place, as the DTensor gradients (views of one buffer)."""
    params = list(c.par.model.parameters())
    mesh = params[0].device_mesh
    chunks = mesh.size(mesh.ndim - 1)  # the shard dimension's ranks (hsdp: a column's)
    rows = [g.reshape(p.shape[0], -1) if p.dim() else g.reshape(1, 1)
            for p, g in zip(params, grads.split(c.sizes()), strict=True)]
    if chunks > 1:  # (one chunk: the layout is the flat order itself)
        rows = [torch.nn.functional.pad(g, (0, 0, 0, -g.shape[0] % chunks)).reshape(chunks, -1) for g in rows]
        grads = torch.cat(rows, dim=1).reshape(-1)
    mine = C.finish_(C.tree_scatter(grads, columns=shard_columns(c.par.model)), c.s, c.par.accum)
    for p, piece in zip(params, mine.split([r.numel() // chunks for r in rows]), strict=True):
        local = p.to_local()
        p.grad = DTensor.from_local(piece[:local.numel()].view_as(local), p.device_mesh, p.placements,
                                    shape=p.shape, stride=p.stride(), run_check=False)


def canonical_update(c, clip_norm: float) -> None:
    """Clip the DTensor gradients by the canonical norm of their full values; then FSDP2's own update."""
    if clip_norm > 0:
        grads = [p.grad for p in c.par.model.parameters()]
        coef = C.clip_coef([g.full_tensor() for g in grads], clip_norm)
        for g in grads:
            g.to_local().mul_(coef)
    c.par.update(0.0)


CANONICAL = canonical_step.Parts(backward, canonical_grads, canonical_update, backward_bn=backward_bn,
                                 first_step=install_units)
