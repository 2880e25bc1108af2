"""`ddp-jit`: DDP as most JAX users write it: parameters and optimizer state replicated (`P()`), the batch
split over `data`, and `jax.jit` over the loss and the optimizer; no shard_map, no collective by hand.

- `auto`: the partitioner sees a gradient of replicated parameters computed from sharded rows and
  all-reduces it where it is made: inside the micro-batch loop, once per micro-batch (`jaxdp inspect`).
- `explicit`: each device's gradient sum is carried through the micro-batch loop with a device axis and
  all-reduced once per step (`step.sum_devices`: cast to `unreduced`, then `reshard` to replicated).
The twin: torch DistributedDataParallel (`torch_ref/strategies/ddp.py`), with `no_sync` under accumulation.
"""
from __future__ import annotations

from ..common import Strategy, apply_update
from . import layout, step

LAYOUT = layout.DDP


def explicit_body(problem, optimizer, specs, accum: int):
    """Replicated parameters; the gradient's one all-reduce after the micro-batch loop; the same update
    on every device."""
    def body(params, opt_state, xs, ys):
        losses, per_device = step.device_grads(problem.loss_fn, lambda p: p, params, xs, ys)
        count = accum * xs.shape[1]
        grads = step.sum_devices(per_device, specs["params"], count)  # P() everywhere: one all-reduce
        loss = losses.sum() / count
        params, opt_state = apply_update(optimizer, grads, opt_state, params)
        return params, opt_state, loss, grads
    return body


def make(problem, optimizer, mesh, opts, return_grads=True) -> Strategy:
    return step.build(LAYOUT, problem, optimizer, mesh, opts, return_grads, explicit_body)
