"""`Recorder`: write a torch training run as a jaxdp trace (docs/TRACE.md), for `jaxdp diff`.

    model, optimizer = torch_ref.parallelize(MyModel(), strategy="ddp", optimizer=make_optimizer)
    with torch_ref.trace.Recorder("run.npz", {"model": "mine", "steps": 10}, model, optimizer=optimizer) as rec:
        rec.init()
        for k in range(1, 11):
            loss = torch_ref.train_step(model, optimizer, x_rows, y_rows, loss_fn)
            rec.step(k, loss, x_global, y_global)

Every rank calls `init` and `step` (under FSDP2 and ZeRO they gather); rank 0 keeps the arrays and
writes the file on a clean exit, atomically (`jaxdp.core.trace.save`). While a Recorder is attached,
`train_step` keeps each step's synchronised averaged gradient (as the update used it, before
clipping); at no other time does it pay for that copy (or, sharded, for that gather).

In a world of more than one rank, `step` also records the ranks' disagreement (`spreads`): for every
mapped buffer and every parameter this rank holds whole (all but zero3's DTensor shards), the largest
|a - b| over the ranks' values of one element, after the step's update, as `step/<k>/spread/<name>`
(docs/TRACE.md, "Rank spread"); NaN when any rank's value is not finite. A trace holds rank 0's values
only: a nonzero spread says the other ranks hold others. When the strategy wraps the model in DDP with
`broadcast_buffers=True` (ddp, zero1), meta `broadcast_buffers: true` says that every rank replaces its
buffers with rank 0's at the next step's first forward.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from jaxdp.core import optimizer_settings
from jaxdp.core import trace as jax_trace
from jaxdp.core.config import ConfigError

from . import api, convert, precision


class Recorder:
    """Records `init/<name>`, `step/<k>/{loss,x,y}`, `step/<k>/grad/<name>` and `step/<k>/param/<name>`,
    and the mapped buffers (BatchNorm's running statistics, rank 0's) as `state/<name>` before the
    first step and `step/<k>/state/<name>` after each, in Flax names and layout (`torch_ref.convert`:
    by module path and layer type; `names=` and `strip_prefix=` as `convert.tensors_to_flax` takes
    them; an unmapped parameter is an error here, at construction).
    `path=None` keeps the arrays in memory (`arrays`, on rank 0) without writing. `meta` is written
    as given, with `framework: torch` added when absent, and `optimizer`'s settings (the torch.optim
    optimizer `parallelize` returned: its param_groups' lr, weight_decay, betas, eps, momentum; or a
    dict, jaxdp/core/optimizer_settings.py) so that `jaxdp diff` replays it; clipping is the
    training step's: put `clip_norm` in meta."""

    def __init__(self, path, meta: dict, model, names=None, strip_prefix: str = "", optimizer=None):
        self.par = api.state_of(model)  # a model parallelize did not return is an error naming the fix
        self.path, self.meta = path, optimizer_settings.merged({"framework": "torch", **meta}, optimizer)
        self.names, self.strip_prefix = names, strip_prefix
        convert.mapping(self.par.module, names, strip_prefix)  # every parameter maps (else one error listing them)
        self.writer = not dist.is_initialized() or dist.get_rank() == 0
        self.arrays: dict[str, np.ndarray] = {}
        self.par.return_grads = True  # train_step now keeps the averaged gradient for `step`
        self.meta.update(self.buffers_from_rank0())
        # the precision census (torch_ref/precision.py) of everything up to the first recorded step: meta "precision"
        self.census = precision.Census(self.par.module, self.meta.get("dtype")).start()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type, *_) -> None:
        self.close(write=exc_type is None)

    def init(self) -> None:
        """The parameters and buffers before the first step (every rank calls it)."""
        self._put("init", self.par.full_params())
        self._put("state", self._buffers())

    def step(self, k: int, loss: float, x=None, y=None) -> None:
        """Step `k`'s loss (`train_step`'s return), its global batch (optional), the gradient the
        update used and the parameters after it. Every rank calls it, after `train_step`."""
        self._census_done()
        grads = self.par.grads
        params = self.par.full_params()  # a collective under sharding: before any rank-0-only work
        spreads = self.spreads()  # a collective (world size > 1)
        if not self.writer:
            return
        if grads is None:
            raise ConfigError("Recorder.step found no gradient: call train_step on the recorded model "
                                  "(after creating the Recorder) before each Recorder.step")
        self.arrays[f"step/{k}/loss"] = np.asarray(loss, dtype=np.float64)
        for key, value in (("x", x), ("y", y)):
            if value is not None:
                self.arrays[f"step/{k}/{key}"] = np.asarray(value.cpu() if hasattr(value, "cpu") else value)
        self._put(f"step/{k}/grad", grads)
        self._put(f"step/{k}/param", params)
        self._put(f"step/{k}/state", self._buffers())
        self._put_spreads(k, spreads)
        self.par.grads = None

    def close(self, write: bool = True) -> None:
        """Detach (train_step stops keeping gradients) and, on rank 0, write the trace."""
        self.par.return_grads, self.par.grads = False, None
        self._census_done()
        if write and self.writer and self.path is not None:
            jax_trace.save(self.path, self.meta, self.arrays)

    def _census_done(self) -> None:
        """Close the census (once) and keep it as meta `precision`."""
        if self.census is not None:
            self.meta[precision.KEY], self.census = self.census.stop(), None

    def _buffers(self) -> dict:
        """The module's buffers (`convert` keeps the mapped ones: running_mean/var -> mean/var)."""
        return {name: b.detach() for name, b in self.par.module.named_buffers()}

    def _put(self, prefix: str, tensors: dict) -> None:
        if self.writer:
            for name, value in convert.tensors_to_flax(self.par.module, tensors, self.names, self.strip_prefix).items():
                self.arrays[f"{prefix}/{name}"] = value

    def buffers_from_rank0(self) -> dict:
        """{'broadcast_buffers': True} when the strategy's wrapper is DDP with broadcast_buffers=True (every rank
        takes rank 0's buffers at the first forward of each step), else {}."""
        wrapper = self.par.model
        return {"broadcast_buffers": True} if isinstance(wrapper, DistributedDataParallel) and \
            wrapper.broadcast_buffers else {}

    def spreads(self) -> dict:
        """{torch name: max over ranks - min over ranks, per element, float64} of every buffer and every
        parameter held whole on this rank (not a DTensor shard); NaN where any rank's value is not finite.
        Every rank calls it (one all-reduce); {} in a world of one."""
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return {}
        module = self.par.module
        tensors = {n: p for n, p in module.named_parameters() if not isinstance(p, DTensor)}
        tensors.update((n, b) for n, b in module.named_buffers() if b.is_floating_point())
        return dict(zip(tensors, rank_spread(list(tensors.values())), strict=True))

    def _put_spreads(self, k: int, spreads: dict) -> None:
        """`step/<k>/spread/<Flax name>`: the largest of each tensor's spreads, a float64 scalar (rank 0)."""
        prefix = f"step/{k}/spread"
        self._put(prefix, spreads)
        for key in [key for key in self.arrays if key.startswith(prefix + "/")]:
            a = self.arrays[key]
            self.arrays[key] = np.asarray(np.max(a) if a.size else 0.0, dtype=np.float64)


def rank_spread(tensors: list) -> list:
    """Per tensor, elementwise (max over ranks) - (min over ranks) in float64, NaN where any rank's value is
    NaN or infinite (never agreement); one all-reduce (MAX) of [v, -v, non-finite flags]."""
    if not tensors:
        return []
    device = tensors[0].device  # a parameter's: where the process group's backend reduces (NCCL: the GPU)
    v = torch.cat([t.detach().reshape(-1).to(device, torch.float64) for t in tensors])
    finite = torch.isfinite(v)
    clean = torch.where(finite, v, torch.zeros_like(v))
    payload = torch.cat([clean, -clean, (~finite).to(torch.float64)])
    dist.all_reduce(payload, op=dist.ReduceOp.MAX)
    hi, neg_lo, bad = payload.split(v.numel())
    spread = torch.where(bad > 0, torch.full_like(hi, float("nan")), hi + neg_lo)
    return [s.view(t.shape) for s, t in zip(spread.split([t.numel() for t in tensors]), tensors, strict=True)]
