"""`hsdp`: hybrid sharding, FSDP2 as a user writes it: `fully_shard(..., mesh=init_device_mesh(device,
(R, S), mesh_dim_names=("replicate", "shard")))` on each unit and the root, the units and the shared
parameters as zero3's (`zero/zero3.py`, `torch_ref/models/units.py`), N = R x S ranks.

FSDP2 shards each parameter along dim 0 over the "shard" dimension (a group of S consecutive ranks:
rank r S + s is row r, column s) and replicates the shards over "replicate". Each unit's all-gathers run
within the group; its gradient is reduce-scattered within the group and the shard then all-reduced
across the groups (FSDP2's HSDP order, jaxdp's too: only Psi / S per rank crosses groups), divided by
N in all (FSDP2's factor: the data-parallel size R x S). Accumulation: `set_requires_gradient_sync`,
as zero3; clip_grad_norm_ on the DTensor gradients (Replicate, Shard(0)) computes the whole norm.
`replicas=1` is zero3 on a (1, N) mesh; `replicas=N` holds whole parameters on every rank (ddp's
algorithm). `hsdp_hosts` ("shard", the default: a host holds whole rows, so FSDP2's all-gathers stay in a
host; "replica": whole columns) orders the mesh over torchrun's host-major ranks (`jaxdp.core.run.hsdp_hosts`),
checked against the hosts (WORLD_SIZE / LOCAL_WORLD_SIZE) before any collective.
`reduction="canonical"`: zero3's (`canonical.UnitReduce` with one shard a rank, `zero3.canonical_grads` with several),
its all-to-all over all N ranks, rank d getting its shard column's chunk (`zero3.shard_columns`): single's bits for
any R x S (N dividing the shards).
"""
from __future__ import annotations

import torch.distributed as dist

from jaxdp.core.run import hsdp_hosts
from jaxdp.core.run.config import ConfigError

from .. import launch
from .common import Strategy
from .zero import zero3


def make(model, optimizer, opts) -> Strategy:
    world = dist.get_world_size()
    if opts.replicas < 1 or world % opts.replicas:
        divisors = ", ".join(str(d) for d in range(1, world + 1) if world % d == 0)
        raise ConfigError(f"replicas={opts.replicas} does not divide the {world} ranks; give one of {divisors}")
    hosts = world // launch.ranks_per_host(world)
    hsdp_hosts.check_hosts(world, opts.replicas, hosts, opts.hsdp_hosts, "torchrun --nnodes")
    return zero3.make(model, optimizer, opts, name="hsdp", replicas=opts.replicas, hosts=opts.hsdp_hosts)
