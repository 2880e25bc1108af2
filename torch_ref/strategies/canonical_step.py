"""Each strategy's step under `reduction="canonical"` (`torch_ref/canonical.py` has the definition).

Every strategy computes each of its shards' gradients by its own backward, folds each shard over the
micro-batches, sums its subtree locally, then keeps its own character for the rest, with the tree in
place of its sum (one communication per step, as native):
- single: nothing crosses a rank;
- ddp, zero1: DDP's reducer with a comm hook (`bucket_hook`): every shard but the step's last is
  computed beside DDP; the last runs through DDP, and each bucket DDP hands to the hook is completed
  with the earlier shards' sums and reduced by the canonical all-reduce (all-to-all, the tree,
  all-gather), in DDP's buckets and order, during that last backward;
- ddp-bucket: the canonical all-reduce per bucket of its own plan, after backward instead of overlapping
  it; ddp-naive: per parameter; ddp-ring: one all-reduce whose all-to-all is isend/irecv pairs and whose
  all-gather is the hand-written ring;
- dp: every rank's partial sums are *gathered* to the server, which runs the tree, clips and steps;
- zero2: the canonical reduce-scatter (all-to-all, then the tree on this rank's chunk);
- zero3: FSDP2's reduce-scatter of each unit is replaced (`UnitReduce`) by the same canonical
  reduce-scatter after the step's last shard backward.
Clipping: the canonical norm of the full gradient (zero2 and zero3 all-gather the gradient for it),
the factor applied element-wise to what each rank holds; then the strategy's own update, unclipped.

With sync BatchNorm (torch_ref/canonical_bn.py) a shard's gradient needs the other shards' statistics,
so each micro-batch's shards are computed together (`sync_bn`: statistics, backward, the statistics'
vector-Jacobian products, every cross-shard sum by the tree), on the unwrapped module, then:
- ddp, zero1: the step's last shard's gradient is handed to DDP's reducer by a backward that yields
  exactly it (after a DDP forward that readies the reducer), so `bucket_hook` runs as without BatchNorm;
- zero3: the passes run on a plain twin of the model (taken before FSDP2 shards it) holding the
  gathered parameters (one all-gather per parameter per step, full parameters held through the step),
  and the canonical reduce-scatter runs on FSDP2's layout into the DTensor gradients (`sync_zero3`);
  FSDP2's own forward, backward and reduce-scatter are not used;
- every other strategy: its own sync of the folded partial sums, as without BatchNorm.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from .. import batchnorm, canonical_bn
from .. import canonical as C
from .common import check_rows
from .zero2 import all_gather


class Canonical:
    """The canonical step of one parallelized model (`Parallel.canonical`); `train` replaces common.train."""

    def __init__(self, par, shards=None, twin=None):
        self.par, self.shards, self.twin = par, shards, twin
        layers = canonical_bn.batchnorms(par.module if twin is None else twin)  # refuses local ones
        if layers and par.name == "zero3" and twin is None:
            raise C.CanonicalError("zero3 with BatchNorm under reduction='canonical' needs the model's plain twin: "
                                   "call torch_ref.parallelize(model, ..., reduction='canonical')")
        self.bn = canonical_bn.BatchNorms(layers, canonical_bn.batchnorms(par.module),
                                          ring=par.name == "ddp-ring") if layers else None
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.params = list(par.module.parameters())
        self.s = self.local = None
        self.offsets, start = {}, 0
        for p in self.params:
            self.offsets[id(p)] = (start, start + p.numel())
            start += p.numel()
        if par.name in ("ddp", "zero1"):
            par.model.register_comm_hook(self, bucket_hook)

    def train(self, x, y, loss_fn, clip_norm: float) -> float:
        par = self.par
        with C.one_thread():
            if self.s is None:
                check_rows(len(x), par.accum, self.params[0].device)
                self.s = C.resolve_shards(self.shards, len(x) * self.world // par.accum, self.world)
                self.local = self.s // self.world
                if par.name == "zero3" and self.bn is None:
                    self.units = install_units(par.model, self.local, par.accum, self.s)
            if self.bn is not None:
                self.bn.shards = self.s
                losses = (self.ddp_backward_bn if par.name in ("ddp", "zero1") else self.sync_bn)(x, y, loss_fn)
            elif par.name == "zero3":
                losses = self.fsdp_backward(x, y, loss_fn)
            elif par.name in ("ddp", "zero1"):
                losses = self.ddp_backward(x, y, loss_fn)
            else:
                grads, losses = C.shard_grads(par.module, self.params, x, y, loss_fn, par.accum, self.local)
                SYNC.get(par.name, sync_buckets)(self, grads)
            loss = C.reduce_loss(losses, self.s, par.accum)
            par.grads = kept(par.full_grads()) if par.keep_grads else None
            UPDATE.get(par.name, update_replicated)(self, clip_norm)
        return float(loss)

    def fsdp_backward(self, x, y, loss_fn) -> torch.Tensor:
        """zero3: each shard's backward through FSDP2 (its gathers, its post-backward: `UnitReduce`)."""
        model, losses, last = self.par.model, C.Folds(), self.par.accum * self.local - 1
        for k, (_, i, xs, ys) in enumerate(C.shards_of(x, y, self.par.accum, self.local)):
            loss = C.scalar(loss_fn(model(xs), ys))
            loss.backward()
            losses.add(i, loss.detach())
            if k != last:
                model.zero_grad(set_to_none=True)  # a shard's output is not a gradient until the last
        return losses.partial()

    def ddp_backward(self, x, y, loss_fn) -> torch.Tensor:
        """ddp, zero1: each shard by its own backward; the step's last through DDP (`bucket_hook`)."""
        par, losses, self.folds, last = self.par, C.Folds(), C.Folds(), self.par.accum * self.local - 1
        for k, (_, i, xs, ys) in enumerate(C.shards_of(x, y, par.accum, self.local)):
            loss = C.scalar(loss_fn((par.model if k == last else par.module)(xs), ys))
            losses.add(i, loss.detach())
            if k == last:
                loss.backward()  # DDP's reducer: its buckets go through bucket_hook
            else:
                self.folds.add(i, C.flat_grad(loss, self.params))
        return losses.partial()

    def sync_bn(self, x, y, loss_fn) -> torch.Tensor:
        """With BatchNorm, every strategy but ddp and zero1: each shard's gradient by `canonical_bn` on the
        plain module (zero3: its twin, holding the gathered parameters), then the strategy's sync."""
        module, params = self.par.module, self.params
        if self.par.name == "zero3":
            full = self.par.full_params()  # a collective: every parameter gathered once per step
            with torch.no_grad():
                for name, p in self.twin.named_parameters():
                    p.copy_(full[name])
            module, params = self.twin, list(self.twin.parameters())
        grads, losses = C.Folds(), C.Folds()
        for i, g, loss in self.bn.shard_grads(module, params, x, y, loss_fn, self.par.accum, self.local):
            grads.add(i, g)
            losses.add(i, loss)
        SYNC.get(self.par.name, sync_buckets)(self, grads.partial())
        return losses.partial()

    def ddp_backward_bn(self, x, y, loss_fn) -> torch.Tensor:
        """ddp, zero1 with BatchNorm: every shard's gradient by `canonical_bn` beside DDP; the step's last
        is then handed to DDP's reducer (`bucket_hook`) by a backward whose gradient is exactly it."""
        par, losses, self.folds, last = self.par, C.Folds(), C.Folds(), self.par.accum * self.local - 1
        for k, (i, g, loss) in enumerate(self.bn.shard_grads(par.module, self.params, x, y, loss_fn, par.accum,
                                                              self.local)):
            losses.add(i, loss)
            if k == last:
                last_g = g
            else:
                self.folds.add(i, g)
        with batchnorm.given(self.bn.last):  # DDP's forward readies its reducer; BatchNorm changes nothing here
            par.model(x.chunk(par.accum * self.local)[-1])
        pieces = last_g.split(self.sizes())
        torch.autograd.backward([p.view_as(p) for p in self.params], [t.view_as(p) for p, t in
                                                                      zip(self.params, pieces, strict=True)])
        return losses.partial()

    def sizes(self) -> list[int]:
        return [p.numel() for p in self.params]

    def groups(self) -> list[tuple[int, int]]:
        """The flat ranges reduced one by one: buckets in backward order, parameters, or everything."""
        if self.par.name == "ddp-naive":
            lists = [[p] for p in reversed(self.params)]
        elif self.par.name == "ddp-bucket":
            lists = [b.params for b in self.par.wrapped.buckets]
        else:
            return [(0, sum(p.numel() for p in self.params))]
        return [(min(self.offsets[id(p)][0] for p in ps), max(self.offsets[id(p)][1] for p in ps)) for ps in lists]


def bucket_hook(c: Canonical, bucket):  # (no annotations: DDP checks them, and these are strings)
    """DDP's comm hook: `bucket` holds the step's last shard's gradient of its parameters (in bucket
    order); it completes that shard's fold, the folds of this bucket's elements go through this rank's
    subtree and the canonical all-reduce, and DDP writes the result into `.grad`."""
    ranges = [c.offsets[id(p)] for p in bucket.parameters()]
    folds = C.Folds()
    folds.acc = [torch.cat([acc[a:b] for a, b in ranges]) for acc in c.folds.acc]
    folds.add(c.local - 1, bucket.buffer())
    future = torch.futures.Future()
    future.set_result(C.finish(C.all_reduce(folds.partial()), c.s, c.par.accum))
    return future


def kept(grads: dict | None) -> dict | None:
    """A copy (zero3's full_tensor at N = 1 is the gradient itself, which clipping scales in place)."""
    return None if grads is None else {name: g.clone() for name, g in grads.items()}


def sync_buckets(c: Canonical, grads: torch.Tensor) -> None:
    """single, ddp-bucket, ddp-naive, ddp-ring: every rank gets the full canonical gradient."""
    flat = torch.empty_like(grads)
    for start, end in c.groups():
        flat[start:end] = C.finish(C.all_reduce(grads[start:end], ring=c.par.name == "ddp-ring"), c.s, c.par.accum)
    C.set_grads(c.params, flat)


def sync_server(c: Canonical, grads: torch.Tensor) -> None:
    """dp: the partial sums are gathered to the server (rank 0), which runs the tree across ranks."""
    if c.world > 1:
        gathered = [torch.empty_like(grads) for _ in range(c.world)] if c.rank == 0 else None
        dist.gather(grads, gathered, dst=0)
        grads = C.tree(torch.stack(gathered)) if c.rank == 0 else None
    if c.rank == 0:
        C.set_grads(c.params, C.finish(grads, c.s, c.par.accum))


def sync_zero2(c: Canonical, grads: torch.Tensor) -> None:
    """zero2: the canonical reduce-scatter of zero2's padded flat layout: this rank's shard."""
    padded = torch.nn.functional.pad(grads, (0, -grads.numel() % c.world))
    main_param(c).grad = C.finish(C.tree_scatter(padded), c.s, c.par.accum)


def sync_zero3(c: Canonical, grads: torch.Tensor) -> None:
    """zero3 with BatchNorm: the canonical reduce-scatter of FSDP2's layout (each parameter's dim-0 chunks
    of ceil(rows / N), rank-major, as its reduce-scatter takes them): this rank's chunks as the DTensor grads."""
    from torch.distributed.tensor import DTensor

    params, rows = list(c.par.model.parameters()), []
    for p, g in zip(params, grads.split(c.sizes()), strict=True):
        g = g.reshape(p.shape[0], -1) if p.dim() else g.reshape(1, 1)
        rows.append(torch.nn.functional.pad(g, (0, 0, 0, -g.shape[0] % c.world)).reshape(c.world, -1))
    mine = C.finish(C.tree_scatter(torch.cat(rows, dim=1).reshape(-1)), c.s, c.par.accum)
    for p, piece in zip(params, mine.split([r.shape[1] for r in rows]), strict=True):
        local = p.to_local()
        p.grad = DTensor.from_local(piece[:local.numel()].view_as(local).clone(), p.device_mesh, p.placements,
                                    shape=p.shape, stride=p.stride(), run_check=False)


def main_param(c: Canonical) -> torch.Tensor:
    return c.par.optimizer.param_groups[0]["params"][0]


def clip_(c: Canonical, clip_norm: float) -> None:
    if clip_norm > 0:
        coef = C.clip_coef([p.grad for p in c.params], clip_norm)
        for p in c.params:
            p.grad.mul_(coef)


def update_replicated(c: Canonical, clip_norm: float) -> None:
    clip_(c, clip_norm)
    c.par.update(0.0)  # the strategy's own update (zero1: ZeroRedundancyOptimizer's), unclipped


def update_server(c: Canonical, clip_norm: float) -> None:
    """dp: the server clips and steps; the new parameters are broadcast from it."""
    if c.rank == 0:
        clip_(c, clip_norm)
        c.par.optimizer.step()
    c.par.module.zero_grad(set_to_none=True)
    with torch.no_grad():
        for p in c.params:
            dist.broadcast(p, src=0)


def update_zero2(c: Canonical, clip_norm: float) -> None:
    shard = main_param(c).grad
    if clip_norm > 0:
        full = all_gather(shard)[:sum(p.numel() for p in c.params)]
        shard.mul_(C.clip_coef(full.split([p.numel() for p in c.params]), clip_norm))
    c.par.update(0.0)


def update_zero3(c: Canonical, clip_norm: float) -> None:
    if clip_norm > 0:
        grads = [p.grad for p in c.par.model.parameters()]
        coef = C.clip_coef([g.full_tensor() for g in grads], clip_norm)
        for g in grads:
            g.to_local().mul_(coef)
    c.par.update(0.0)


def install_units(model, local: int, accum: int, shards: int) -> list:
    """zero3: every FSDP2 unit's reduce-scatter and all-reduce hook replaced by a `UnitReduce`."""
    from torch.distributed.fsdp import FSDPModule

    units = []
    for module in model.modules():
        if isinstance(module, FSDPModule):
            unit = C.UnitReduce(local, accum, shards)
            module.set_custom_reduce_scatter(unit)
            module.set_all_reduce_hook(unit.hook)
            module.set_gradient_divide_factor(1.0)  # FSDP2 divides by nothing: the tree's /S and /A are all
            units.append(unit)
    return units


def twin_of(model: torch.nn.Module, name: str) -> torch.nn.Module | None:
    """zero3 with BatchNorm: a plain copy of the model taken before FSDP2 shards it (`sync_bn` runs the
    per-shard passes on it with the gathered parameters); otherwise None."""
    return copy.deepcopy(model) if name == "zero3" and canonical_bn.batchnorms(model) else None


SYNC = {"dp": sync_server, "zero2": sync_zero2, "zero3": sync_zero3}
UPDATE = {"dp": update_server, "zero2": update_zero2, "zero3": update_zero3}
