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
import re

import jax
import numpy as np

STAGE = {"single": 0, "dp": 0, "ddp": 0, "ddp-pmap": 0, "ddp-bucket": 0, "ddp-ring": 0,
         "zero1": 1, "zero2": 2, "zero3": 3}
STATE_ARRAYS_PER_PARAM = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}


def bytes_on(tree, device) -> int:
    """Bytes of `tree`'s arrays that live on `device` (its addressable shards there)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        total += sum(s.data.nbytes for s in leaf.addressable_shards if s.device == device)
    return total


def step_memory(compiled) -> dict:
    """What a compiled step needs on one device, from `compiled.memory_analysis()`:
    state_bytes = its arguments (train state + batch shard), temp_bytes = its temporaries, and
    peak_bytes = arguments + temporaries + outputs not aliased to (donated) arguments."""
    m = compiled.memory_analysis()
    args, temp = int(m.argument_size_in_bytes), int(m.temp_size_in_bytes)
    fresh_outputs = int(m.output_size_in_bytes) - int(m.alias_size_in_bytes)
    return {"state_bytes": args, "temp_bytes": temp, "peak_bytes": args + temp + fresh_outputs}


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
    from . import models, train

    devs, dataset, problem, optimizer, strategy = train.prepare(cfg, return_grads=True)
    state = strategy.init(problem.params)
    batch = strategy.put_batch(*train.host_batch(cfg, dataset, 1))
    compiled = strategy.compiled_step.lower(state, *batch).compile()
    measured = {"params": bytes_on(state.params, devs[0]), "opt_state": bytes_on(state.opt_state, devs[0])}
    state, metrics = compiled(state, *batch)
    measured["grads"] = bytes_on(metrics["grads"], devs[0])

    itemsize = np.dtype(models.MASTER_DTYPE[cfg.dtype]).itemsize
    sizes = [int(np.prod(p.shape)) for p in jax.tree.leaves(problem.params)]
    scalars = sum(leaf.dtype.itemsize for leaf in jax.tree.leaves(jax.eval_shape(optimizer.init, problem.params))
                  if leaf.ndim == 0)
    k_bytes = STATE_ARRAYS_PER_PARAM[cfg.optimizer] * itemsize
    expected = formula(STAGE[cfg.strategy], sizes, cfg.devices, itemsize, itemsize, k_bytes, scalars)
    analysis = compiled.memory_analysis()
    return {"strategy": cfg.strategy, "devices": cfg.devices, "psi": sum(sizes), "k_bytes": k_bytes,
            "param_bytes": itemsize, "measured": measured, "formula": expected,
            "temp_bytes": int(getattr(analysis, "temp_size_in_bytes", -1)) if analysis is not None else -1}


def format_memory(rows: list[dict]) -> str:
    lines = [
        f"{'strategy':<10} {'N':>3} {'params':>10} {'grads':>10} {'opt state':>10} {'formula p/g/o':>28} {'temp':>9}"
    ]
    for r in rows:
        m, f = r["measured"], r["formula"]
        lines.append(
            f"{r['strategy']:<10} {r['devices']:>3} {m['params']:>10} {m['grads']:>10} {m['opt_state']:>10} "
            f"{f['params']:>9}/{f['grads']}/{f['opt_state']:<9} {r['temp_bytes']:>9}"
        )
    return "\n".join(lines)


# ---- communication, read from the compiled program ----------------------------------------------

DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
KINDS = {
    "all-reduce": "all-reduce",
    "reduce-scatter": "reduce-scatter",
    "all-gather": "all-gather",
    "collective-permute": "point-to-point",
}
_OP = re.compile(
    r"=\s*(?P<shape>.+?)\s+(?P<op>all-reduce|reduce-scatter|all-gather|collective-permute)"
    r"(?P<start>-start)?\("
)
_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128)\[([\d,]*)\]")


def _nbytes(shape_text: str, last_only: bool = False) -> int:
    arrays = [
        DTYPE_BYTES[d] * math.prod(int(x) for x in dims.split(",") if x) for d, dims in _ARRAY.findall(shape_text)
    ]
    return arrays[-1] if last_only else sum(arrays)


def _group_size(line: str, n_devices: int) -> int:
    m = re.search(r"replica_groups=\{\{([\d,]+)\}", line)
    if m:
        return len(m.group(1).split(","))
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]", line)  # iota form [groups, size]
    return int(m.group(2)) if m else n_devices


def collectives(hlo_text: str, n_devices: int) -> list[dict]:
    """Every collective of a compiled (post-optimisation) HLO module: its kind, the bytes of its
    result, its group size, and the bytes each device sends by the ring algorithm:
      all-reduce of B bytes          2 (n-1)/n B      reduce-scatter to B bytes   (n-1) B
      all-gather to B bytes          (n-1)/n B        collective-permute of B     B per sending pair / n
    (for collective-permute: the mean over devices; `max_sent` is the busiest device's)."""
    found = []
    for line in hlo_text.splitlines():
        m = _OP.search(line)
        if not m or "-done" in line.split("=")[0]:
            continue
        op = m.group("op")
        # async *-start ops return (operands..., result): the result is the last array.
        nbytes = _nbytes(m.group("shape"), last_only=bool(m.group("start")) and op != "all-reduce")
        n = _group_size(line, n_devices)
        if op == "collective-permute":
            pairs = (
                re.findall(r"\{(\d+),(\d+)\}", line.split("source_target_pairs=")[1])
                if "source_target_pairs=" in line
                else []
            )
            senders = [int(s) for s, _ in pairs]
            sent = nbytes * len(pairs) / n_devices
            max_sent = nbytes * max((senders.count(d) for d in set(senders)), default=0)
        else:
            sent = {
                "all-reduce": 2 * (n - 1) / n * nbytes,
                "reduce-scatter": (n - 1) * nbytes,
                "all-gather": (n - 1) / n * nbytes,
            }[op]
            max_sent = sent
        found.append({"op": op, "kind": KINDS[op], "bytes": nbytes, "group": n, "sent": sent, "max_sent": max_sent})
    return found


def communication(hlo_text: str, n_devices: int) -> dict:
    """Bytes sent per device per step, by kind of collective, and the number of ops of each kind."""
    out = {kind: {"ops": 0, "sent": 0.0, "max_sent": 0.0} for kind in KINDS.values()}
    for c in collectives(hlo_text, n_devices):
        entry = out[c["kind"]]
        entry["ops"] += 1
        entry["sent"] += c["sent"]
        entry["max_sent"] += c["max_sent"]
    out["total"] = sum(v["sent"] for v in out.values())
    return out


def step_communication(strategy, state, batch, n_devices: int) -> dict:
    """`communication` of a strategy's compiled step."""
    return communication(strategy.compiled_step.lower(state, *batch).compile().as_text(), n_devices)


def theory(strategy: str, sizes: list[int], n: int, itemsize: int, loss_itemsize: int | None = None) -> dict:
    """Bytes each device sends per step by the textbook algorithms (ring collectives), by kind.
    Psi = sum(sizes); Psi_N = sum(ceil(size / n)) (ZeRO pads each parameter to a multiple of n).
    The loss is averaged for the log by one scalar all-reduce (not for `dp`, whose tree is counted
    separately, nor for one device)."""
    psi = sum(sizes)
    psi_n = sum(math.ceil(s / n) for s in sizes)
    loss = 2 * (n - 1) / n * (loss_itemsize or itemsize)
    ring = 2 * (n - 1) / n
    out = {"all-reduce": loss, "reduce-scatter": 0.0, "all-gather": 0.0, "point-to-point": 0.0}
    if strategy in ("ddp", "ddp-pmap", "ddp-bucket"):
        out["all-reduce"] += ring * psi * itemsize
    elif strategy == "ddp-ring":
        out["point-to-point"] = 2 * (n - 1) * math.ceil(psi / n) * itemsize
    elif strategy == "zero1":
        out["all-reduce"] += ring * psi * itemsize
        out["all-gather"] = (n - 1) * psi_n * itemsize
    elif strategy in ("zero2", "zero3"):
        out["reduce-scatter"] = (n - 1) * psi_n * itemsize
        # zero3 also gathers again for backward (x2) in theory; see docs/STRATEGIES.md for XLA:CPU.
        out["all-gather"] = (n - 1) * psi_n * itemsize * (2 if strategy == "zero3" else 1)
    else:
        raise ValueError(f"no communication theory for {strategy!r}")
    if n == 1:
        out = {k: 0.0 for k in out}
    out["total"] = sum(out.values())
    return out
