"""`fsdp-jit`: FSDP (ZeRO stage 3) the levanter / MaxText way: parameters and optimizer state sharded over
`data` (each array along its largest dimension that N divides, `layout.leaf_spec`), the batch split over
`data`, and `jax.jit` over the loss and the optimizer. Nothing is written per layer: the compiler gathers
the parameters where the loss uses them and reduces the gradient into the parameters' shards.

- `auto`: the parameters the loss reads are constrained whole (`step.plain_body`'s `whole`: FSDP's gather;
  left alone, the partitioner ran a split small model tensor-parallel and reduced activations in bf16); it
  decides where the all-gathers go (hoisted out of the micro-batch loop on XLA:CPU) and how each
  micro-batch's gradient is reduced.
- `explicit`: the body says it: every micro-batch gathers the full parameters (`reshard` to replicated)
  and takes each device's own gradient of them; the devices' sums are carried through the loop and
  reduced once per step into the shards (`step.sum_devices`: a reduce-scatter's bytes); the update runs
  on the shards and nothing is gathered after it. The gather does not depend on the micro-batch, so XLA
  may hoist it out of the loop (measured on XLA:CPU: it does; docs/STRATEGIES.md).
The twin: torch FSDP2, `fully_shard` (`torch_ref/strategies/zero/zero3.py`), dim-0 shards per unit.
"""
from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P
from jax.sharding import reshard

from ..common import Strategy, apply_update
from . import layout, step

LAYOUT = layout.FSDP


def gather(shards):
    """The full parameters: every sharded array all-gathered (`reshard` to replicated)."""
    return jax.tree.map(lambda a: reshard(a, P()), shards)


def explicit_body(problem, optimizer, specs, accum: int):
    """Sharded parameters and optimizer state: gather per micro-batch, reduce once into the shards, update."""
    def body(params, opt_state, xs, ys):
        losses, per_device = step.device_grads(problem.loss_fn, gather, params, xs, ys)
        count = accum * xs.shape[1]
        grads = step.sum_devices(per_device, specs["params"], count)
        params, opt_state = apply_update(optimizer, grads, opt_state, params)
        return params, opt_state, losses.sum() / count, grads
    return body


def make(problem, optimizer, mesh, opts, return_grads=True) -> Strategy:
    return step.build(LAYOUT, problem, optimizer, mesh, opts, return_grads, explicit_body)
