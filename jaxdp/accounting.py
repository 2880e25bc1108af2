"""Per-device memory, measured from the arrays, next to the ZeRO paper's formula.

Measured: the bytes that one device holds of the parameters, the optimizer state (both read from
the train state's addressable shards) and the synchronised gradient (read from the step's own
gradient output, in the layout the strategy keeps it: full for ddp and zero1, a shard for zero2/3),
plus the compiled step's temporary bytes (`memory_analysis()`).

Formula (ZeRO paper, Rajbhandari et al. 2020, section 5): with Psi parameters, b_p bytes per
parameter, b_g per gradient and K bytes of optimizer state per parameter,
  ddp (stage 0): (b_p + b_g + K) Psi      zero1: (b_p + b_g) Psi + K Psi / N
  zero2:          b_p Psi + (b_g + K) Psi / N      zero3: (b_p + b_g + K) Psi / N
Here Psi / N is exact: sum over parameters of ceil(size / N) (each parameter is padded to a
multiple of N), and the optimizer's replicated scalars (Adam's step count) are added to the state.
"""
from __future__ import annotations

import math

import jax
import numpy as np

STAGE = {"single": 0, "dp": 0, "ddp": 0, "ddp-pmap": 0, "ddp-bucket": 0, "ddp-ring": 0,
         "zero1": 1, "zero2": 2, "zero3": 3}
STATE_ARRAYS_PER_PARAM = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}


def bytes_on(tree, device) -> int:
    """Bytes of `tree`'s arrays that live on `device` (its addressable shards there)."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        total += sum(s.data.nbytes for s in leaf.addressable_shards if s.device == device)
    return total


def formula(stage: int, sizes: list[int], n: int, param_bytes: int, grad_bytes: int, k_bytes: int,
            replicated_state_bytes: int = 0) -> dict:
    """Bytes per device by the ZeRO formula, with exact padding."""
    psi = sum(sizes)
    per_device = sum(math.ceil(s / n) for s in sizes)  # Psi / N, padded
    return {
        "params": param_bytes * (per_device if stage >= 3 else psi),
        "grads": grad_bytes * (per_device if stage >= 2 else psi),
        "opt_state": k_bytes * (per_device if stage >= 1 else psi) + replicated_state_bytes,
    }


def memory(cfg) -> dict:
    """Measure one step of `cfg` on device 0 of its mesh and set it next to the formula."""
    from . import data, devices, models, optim, strategies

    devs = devices.setup(cfg.devices, cfg.platform)
    if cfg.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    dataset = data.load(cfg.data, cfg.seed, cfg.seq_len)
    with jax.default_device(jax.devices("cpu")[0]):
        problem = models.init(cfg, dataset)
    optimizer = optim.for_config(cfg)
    strategy = strategies.make(cfg.strategy, problem, optimizer, devices.mesh(devs), cfg, return_grads=True)
    state = strategy.init(problem.params)
    x, y = dataset.batch(1, cfg.batch_size)
    x = x.astype(models.MASTER_DTYPE[cfg.dtype]) if np.issubdtype(x.dtype, np.floating) else x
    batch = strategy.put_batch(x, y)
    compiled = strategy.compiled_step.lower(state, *batch).compile()
    measured = {"params": bytes_on(state.params, devs[0]), "opt_state": bytes_on(state.opt_state, devs[0])}
    state, metrics = compiled(state, *batch)
    measured["grads"] = bytes_on(metrics["grads"], devs[0])

    itemsize = np.dtype(models.MASTER_DTYPE[cfg.dtype]).itemsize
    sizes = [int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(problem.params)]
    scalars = sum(leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(jax.eval_shape(optimizer.init, problem.params))
                  if leaf.ndim == 0)
    k_bytes = STATE_ARRAYS_PER_PARAM[cfg.optimizer] * itemsize
    expected = formula(STAGE[cfg.strategy], sizes, cfg.devices, itemsize, itemsize, k_bytes, scalars)
    analysis = compiled.memory_analysis()
    return {"strategy": cfg.strategy, "devices": cfg.devices, "psi": sum(sizes), "k_bytes": k_bytes,
            "param_bytes": itemsize, "measured": measured, "formula": expected,
            "temp_bytes": int(getattr(analysis, "temp_size_in_bytes", -1)) if analysis is not None else -1}


def format_memory(rows: list[dict]) -> str:
    lines = [f"{'strategy':<10} {'N':>3} {'params':>10} {'grads':>10} {'opt state':>10} {'formula p/g/o':>28} {'temp':>9}"]
    for r in rows:
        m, f = r["measured"], r["formula"]
        lines.append(f"{r['strategy']:<10} {r['devices']:>3} {m['params']:>10} {m['grads']:>10} {m['opt_state']:>10} "
                     f"{f['params']:>9}/{f['grads']}/{f['opt_state']:<9} {r['temp_bytes']:>9}")
    return "\n".join(lines)
