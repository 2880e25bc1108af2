"""Copy me: your own torch data-parallel step, checked against what you meant (docs/CHECK.md).

    jaxdp check --framework torch examples/check_torch.py:make --devices 2 --intent ddp --accumulation 2
    jaxdp check --framework torch examples/check_torch.py:make_without_no_sync --devices 2 --intent ddp --accumulation 2

`make(rank, world)` runs on every rank of a gloo CPU world (the process group is initialised for you) and returns
(step, args, model, optimizer): one optimizer step as your training loop runs it, its inputs, the wrapped model
and its optimizer. `make` accumulates 2 micro-batches with DDP's `no_sync()` on the first (one gradient
all-reduce per step: exit 0); `make_without_no_sync` forgets it (the gradients all-reduced every micro-batch:
exit 1, finding sync-per-microbatch).
"""
import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def build(rank, world, no_sync=True):
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    g = torch.Generator().manual_seed(rank)  # each rank its own rows
    x, y = torch.randn(8, 16, generator=g), torch.randint(0, 8, (8,), generator=g)

    def step(x, y, k=2):
        for i, (xm, ym) in enumerate(zip(x.chunk(k), y.chunk(k), strict=True)):
            last = i == k - 1
            with model.no_sync() if no_sync and not last else contextlib.nullcontext():
                F.cross_entropy(model(xm), ym).backward()
        optimizer.step()
        optimizer.zero_grad()
    return step, (x, y), model, optimizer


def make(rank, world):
    return build(rank, world)


def make_without_no_sync(rank, world):
    return build(rank, world, no_sync=False)



if __name__ == "__main__":  # python examples/check_torch.py [--function F]: the same as the jaxdp check lines above
    from jaxdp.harness.cli import check_example

    check_example(__file__, ("make", "make_without_no_sync"), "--framework", "torch", "--intent", "ddp",
                  "--accumulation", "2")
