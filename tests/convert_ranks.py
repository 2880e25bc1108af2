"""What the spawned ranks of tests/torch_ref/test_convert.py run: kept free of JAX so a rank starts quickly."""
from __future__ import annotations

from torch import nn

from torch_ref import convert


class Net(nn.Module):
    """A small user model: a conv stack in a list, BatchNorm, a head (its NNX twin: test_convert.FlaxNet)."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3)])
        self.norm = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 2)


def fsdp2_round_trip(rank, world, params):
    """Load into an FSDP2-sharded Net (DTensor shards) and gather back; also each shard's size."""
    from torch.distributed.fsdp import fully_shard

    model = Net().double()
    fully_shard(model)
    assert all(hasattr(p, "device_mesh") for p in model.parameters())
    convert.load_flax(model, params)
    return convert.to_flax(model), {n: p.to_local().numel() for n, p in model.named_parameters()}
