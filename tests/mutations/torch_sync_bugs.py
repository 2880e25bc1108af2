"""The catalogue's gradient-synchronisation bugs in torch_ref (`torch_bugs.PATCHES` holds them): each a function
returning the (object, attribute, value) patches that put the bug where a torch DP implementation has it: the
process-group mesh handed to FSDP2, the hand-written ZeRO gather, the clip's place in the step, a hand-written
bucket's divide, a parameter DDP is told to ignore, the tie a wrapper breaks. Test-only: applied in the rank that
runs the bug."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp._fully_shard import _fsdp_param_group as fsdp_group
from torch.nn.parallel import DistributedDataParallel

from torch_ref import api, launch, optim
from torch_ref.collectives import all_gather
from torch_ref.models import gpt2
from torch_ref.strategies import bucket, common, ddp
from torch_ref.strategies.zero import step, zero3


def hsdp_wrong_axis():
    """hsdp: every unit handed the mesh's "shard" dimension alone (`mesh["shard"]` where the 2-D mesh was meant):
    each gradient reduce-scattered within its shard group (one mesh axis) and never all-reduced across the
    replica groups, each group stepping with its own rows. The trace's `hsdp_grid` is read from that (1-D) mesh:
    one row."""
    shard, grid = zero3.fully_shard, launch.hsdp_grid

    def fully_shard(module, *, mesh, **kw):
        return shard(module, mesh=mesh["shard"] if mesh.ndim == 2 else mesh, **kw)

    def one_row(model, world):
        mesh = next(p.device_mesh for p in model.parameters() if hasattr(p, "device_mesh"))
        return grid(model, world) if mesh.ndim == 2 else [[[int(k), int(k) // launch.ranks_per_host(world)]
                                                            for k in mesh.mesh.tolist()]]

    return [(zero3, "fully_shard", fully_shard), (launch, "hsdp_grid", one_row)]


def zero_gather_offset():
    """A ZeRO gather one slot off (rank i's shard written where rank i + 1's belongs, the last wrapping to the
    first): zero2's gather of the updated shards into the parameters, and FSDP2's copy-out of each unit's
    all-gather into the unsharded parameters that forward and backward use (zero3, hsdp)."""
    copy_out = fsdp_group.foreach_all_gather_copy_out

    def gather(shard):
        with torch.no_grad():
            full = all_gather(shard.main_param.detach()).roll(shard.main_param.numel())
            common.unflatten_into(full[:shard.numel], shard.params)

    def rotated_copy_out(result, fsdp_params, group):
        if isinstance(result.all_gather_work, dist.distributed_c10d.Work):
            result.all_gather_work.wait()
        rows = result.all_gather_output.view(group.size(), -1)
        rows.copy_(rows.roll(1, 0))
        return copy_out(result._replace(all_gather_work=None), fsdp_params, group)

    return [(step, "gather", gather), (fsdp_group, "foreach_all_gather_copy_out", rotated_copy_out)]


def clip_hook(limit, bucket):  # (no annotations: DDP checks them)
    """A DDP comm hook that clips the bucket's local gradient by its own norm, then all-reduces its mean (with
    one bucket, the whole local gradient: Horovod's clipping before the allreduce)."""
    buffer = bucket.buffer()
    if limit[0] > 0:
        buffer.mul_(min(limit[0] / (float(buffer.norm()) + 1e-6), 1.0))
    buffer.div_(dist.get_world_size())
    return dist.all_reduce(buffer, async_op=True).get_future().then(lambda fut: fut.value()[0])


def clip_before_reduce():
    """Each rank clips its local gradient before the reduction: under DDP a comm hook that clips each bucket
    (`clip_hook`), under the strategies that reduce after backward (zero2's reduce-scatter, dp) torch's
    clip_grad_norm_ on the rank's own `.grad`s between backward and the sync."""
    train, apply_ddp, limit = api.train, ddp.apply_ddp, [0.0]

    def hooked(model, bucket_mb):
        wrapped = apply_ddp(model, bucket_mb)
        wrapped.register_comm_hook(limit, clip_hook)
        return wrapped

    def clipping_first(par, x, y, loss_fn, clip_norm):
        limit[0], sync = clip_norm, par.sync

        def clip_then_sync():
            optim.clip_([p for p in par.module.parameters() if p.grad is not None], clip_norm)
            sync()

        par.sync = clip_then_sync
        try:
            return train(par, x, y, loss_fn, clip_norm)
        finally:
            par.sync = sync

    return [(api, "train", clipping_first), (ddp, "apply_ddp", hooked)]


def bucket_missing_one_over_n():
    """ddp-bucket: the first bucket made (the last layers') is built with a world size of 1, so it is
    all-reduced (summed) but never divided by N; the other buckets are."""
    init, made = bucket.Bucket.__init__, []

    def __init__(self, params, world_size):
        init(self, params, world_size if made else 1)
        made.append(self)

    return [(bucket.Bucket, "__init__", __init__)]


def leaf_skipped():
    """ddp: the model's last parameter in DDP's ignore list (`_set_params_and_buffers_to_ignore_for_model`,
    as code that keeps a parameter out of DDP does): its gradient is never all-reduced, each rank steps
    with its own."""
    apply_ddp = ddp.apply_ddp

    def ignoring_one(model, bucket_mb):
        last = [name for name, _ in model.named_parameters()][-1]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, [last])
        return apply_ddp(model, bucket_mb)

    return [(ddp, "apply_ddp", ignoring_one)]


def untie(model) -> None:
    """Every module but the first that holds a shared parameter gets a plain (detached) view of it instead, as
    a wrapper that materialises each module's parameters on its own and never re-ties them: the weight
    still moves with the parameter, but that use's gradient is lost."""
    first = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None or first.setdefault(id(p), module) is module:
                continue
            del module._parameters[name]
            setattr(module, name, p.detach())


def tied_forward(self, tokens):
    """torch_ref's GPT-2 whose tied head reads the embedding weight detached: its gradient from the
    embedding's use only."""
    positions = torch.arange(tokens.shape[1], device=tokens.device)
    x = self.wte(tokens) + self.wpe(positions)
    for block in self.h:
        x = block(x)
    return F.linear(self.ln_f(x), self.wte.weight.detach())


def tied_grad_once():
    """The tied weight's gradient from one use only (the head's use lost): transformers' tied modules untied by
    the wrapper (`untie`: DDP's `apply_ddp`, FSDP2's `apply_fsdp`), torch_ref's functional tie read detached
    (`tied_forward`, under any strategy)."""
    apply_ddp, apply_fsdp = ddp.apply_ddp, zero3.apply_fsdp

    def untying_ddp(model, bucket_mb):
        untie(model)
        return apply_ddp(model, bucket_mb)

    def untying_fsdp(model, *args, **kw):
        untie(model)
        return apply_fsdp(model, *args, **kw)

    return [(ddp, "apply_ddp", untying_ddp), (zero3, "apply_fsdp", untying_fsdp), (gpt2.GPT2, "forward", tied_forward)]


PATCHES = {
    "hsdp-wrong-axis": hsdp_wrong_axis,
    "zero-gather-offset": zero_gather_offset,
    "clip-before-reduce": clip_before_reduce,
    "bucket-missing-1/N": bucket_missing_one_over_n,
    "leaf-skipped": leaf_skipped,
    "tied-grad-once": tied_grad_once,
}
