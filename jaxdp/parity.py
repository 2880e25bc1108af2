"""Cross-framework parity: the same configuration trained by jaxdp and by torch_ref gives the same
losses, gradients and parameters, strategy by strategy.

`check(cfg, pairs)` trains every pair (JAX in this process, torch in one spawned world per device
count, running all its configurations), diffs the two traces step by step, and returns one row per
pair; `format_table` prints them. The comparison is `jaxdp.trace.diff`: per array, the worst
|jax - torch| relative to the largest |torch| of that array.

Tolerances (stated with their reasons; `tolerance(cfg)`):
- float64: 1e-12 for every field. Both sides compute the same sums in different orders (XLA's and
  ATen's kernels), which moves results by ~1e-15 per step; 10 steps of Adam stay below ~1e-13.
- float32: gradients 1e-5 relative (unit roundoff 6e-8, times the reduction lengths of a step);
  parameters: for SGD and momentum, updates are linear in the gradient, so 1e-5 too; Adam and AdamW
  normalise each element by sqrt(v), so a tiny gradient difference on a small-gradient element can
  become a difference of up to ~lr in that element's update, per step: the bound is 2 x lr x step
  (absolute), and the test says so instead of loosening the relative bound.
- bfloat16: only losses are compared, within 1% relative over 20 steps (seen: 0.2%): the two frameworks choose
  different ops to run in bf16 (torch autocast keeps softmax, layer norm and the loss in fp32; JAX
  computes the layers in bf16), so gradients differ at bf16's resolution (2^-8 = 0.4%) every step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import trace as trace_mod
from .config import RunConfig

# (label, jaxdp strategy, torch_ref strategy): same names where both frameworks have them, and the
# two framework-only variants against the other side's plain ddp.
PAIRS = [(s, s, s) for s in ("single", "dp", "ddp", "ddp-bucket", "ddp-ring", "zero1", "zero2", "zero3")] + [
    ("ddp-pmap/ddp", "ddp-pmap", "ddp"), ("ddp/ddp-naive", "ddp", "ddp-naive")]
PAIR_BY_LABEL = {label: (j, t) for label, j, t in PAIRS}
FIELDS = ("loss", "grad", "param")


def pairs_for(names) -> list[tuple[str, str, str]]:
    """Pairs for strategy names: a name both sides have, or 'jax~torch' (e.g. ddp-pmap~ddp)."""
    out = []
    for name in names:
        if "~" in name:
            j, t = name.split("~")
            out.append((f"{j}/{t}", j, t))
        elif name in ("ddp-pmap", "ddp-naive"):
            out.append(
                ("ddp-pmap/ddp", "ddp-pmap", "ddp") if name == "ddp-pmap" else ("ddp/ddp-naive", "ddp", "ddp-naive")
            )
        else:
            out.append((name, name, name))
    return out


@dataclass
class Tolerance:
    loss: float
    grad: float
    param: float
    param_absolute_per_step: float | None = None  # Adam: |dp| <= this x step, instead of `param`
    why: str = ""


def tolerance(cfg: RunConfig) -> Tolerance:
    if cfg.dtype == "float64":
        return Tolerance(1e-12, 1e-12, 1e-12, why="float64: same sums, different orders: ~1e-15")
    if cfg.dtype == "float32":
        if cfg.optimizer in ("adam", "adamw"):
            return Tolerance(
                1e-5,
                1e-5,
                math.inf,
                2 * cfg.lr,
                why="float32; Adam turns gradient differences into up to ~lr per element per step",
            )
        return Tolerance(1e-5, 1e-5, 1e-5, why="float32; SGD updates are linear in the gradient")
    return Tolerance(1e-2, math.inf, math.inf, why="bfloat16: losses only (1%), bf16 resolution 0.4% per op")


@dataclass
class Row:
    label: str
    cfg: RunConfig
    worst: dict  # field -> worst relative error over all steps
    per_step: dict  # field -> [worst relative error at step k]
    param_abs_per_step: list  # [max |jax - torch| over parameters at step k]
    init_identical: bool
    tol: Tolerance
    failures: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def compare(jax_trace, torch_trace, cfg: RunConfig, label: str = "") -> Row:
    """Diff two traces of `cfg` step by step and judge them against `tolerance(cfg)`."""
    diff = trace_mod.diff(jax_trace, torch_trace)
    steps = range(torch_trace.first_step, torch_trace.steps + 1)
    per_step = {
        f: [max([e for k, e in diff["per_array"].items() if k.startswith(f"step/{s}/{f}")] or [0.0]) for s in steps]
        for f in FIELDS
    }
    abs_param = [
        max(
            float(np.max(np.abs(jax_trace.arrays[k] - torch_trace.arrays[k])))
            for k in torch_trace.arrays
            if k.startswith(f"step/{s}/param/")
        )
        for s in steps
    ]
    init_identical = all(
        np.array_equal(jax_trace.arrays[k], torch_trace.arrays[k]) for k in torch_trace.arrays if k.startswith("init/")
    )
    tol = tolerance(cfg)
    row = Row(label, cfg, {f: max(per_step[f]) for f in FIELDS}, per_step, abs_param, init_identical, tol)
    if not init_identical:
        row.failures.append("initial parameters differ")
    for f in FIELDS:
        if row.worst[f] > getattr(tol, f):
            row.failures.append(f"{f} {row.worst[f]:.2e} > {getattr(tol, f):.0e}")
    if tol.param_absolute_per_step is not None:
        for s, err in zip(steps, abs_param, strict=False):
            if err > tol.param_absolute_per_step * s:
                row.failures.append(f"param |diff| {err:.2e} > 2 lr x step {s}")
                break
    return row


# ---- running both frameworks ----------------------------------------------------------------------


def run_jax(cfg: RunConfig):
    from . import train

    return train.run(cfg, record=True, progress=False)


def _torch_jobs(rank: int, n: int, jobs: list) -> list:
    from torch_ref.train import train_rank

    return [train_rank(rank, n, cfg, init, True) for cfg, init in jobs]


def run_torch(cfgs: list[RunConfig], timeout_s: float = 900.0) -> dict:
    """{cfg: torch_ref RunResult}: one spawned world per device count runs all of its configs;
    world size 1 runs in this process."""
    import torch
    import torch.distributed as dist

    from torch_ref import launch, models
    from torch_ref.train import train_rank

    from . import data

    inits = {}
    out = {}
    for cfg in cfgs:
        key = (cfg.model, cfg.data, cfg.seed, cfg.dtype, cfg.hidden, cfg.n_layer, cfg.n_head, cfg.d_model, cfg.seq_len)
        if key not in inits:
            inits[key] = models.jax_init(cfg, data.load(cfg.data, cfg.seed, cfg.seq_len))
        by_n = out.setdefault(cfg.devices, [])
        by_n.append((cfg, inits[key]))
    results = {}
    for n, jobs in sorted(out.items()):
        if n == 1:
            for cfg, init in jobs:
                if cfg.strategy != "single":
                    launch.init_process_group(torch.device("cpu"), 0, 1, 120, store=dist.HashStore())
                try:
                    results[cfg] = train_rank(0, 1, cfg, init, True, device=torch.device("cpu"))
                finally:
                    if dist.is_initialized():
                        dist.destroy_process_group()
        else:
            per_rank = launch.launch(_torch_jobs, n, jobs, timeout_s=timeout_s, pg_timeout_s=120)
            for (cfg, _), res in zip(jobs, per_rank[0], strict=False):
                results[cfg] = res
    return results


def check(cfg: RunConfig, pairs, jax_runner=run_jax, torch_runner=run_torch) -> list[Row]:
    """Train each (label, jax strategy, torch strategy) pair on `cfg` and compare."""
    jax_cfgs = {
        label: cfg.replace(strategy=j, devices=1 if j == "single" else cfg.devices).validate("jax")
        for label, j, _ in pairs
    }
    torch_cfgs = {
        label: cfg.replace(strategy=t, devices=1 if t == "single" else cfg.devices).validate("torch")
        for label, _, t in pairs
    }
    torch_results = torch_runner(list(dict.fromkeys(torch_cfgs.values())))
    rows = []
    for label, _, _ in pairs:
        j = jax_runner(jax_cfgs[label])
        t = torch_results[torch_cfgs[label]]
        rows.append(
            compare(trace_mod.Trace(j.meta, j.arrays), trace_mod.Trace(t.meta, t.arrays), jax_cfgs[label], label)
        )
    return rows


def format_table(rows: list[Row]) -> str:
    head = f"{'strategy':<16} {'N':>2} {'init':>9} {'loss':>9} {'grad':>9} {'param':>9}  verdict"
    lines = [head, "-" * len(head)]
    for r in rows:
        init = "identical" if r.init_identical else "DIFFER"
        verdict = "ok" if r.ok else "MISMATCH: " + "; ".join(r.failures)
        lines.append(
            f"{r.label:<16} {r.cfg.devices:>2} {init:>9} {r.worst['loss']:>9.2e} {r.worst['grad']:>9.2e} "
            f"{r.worst['param']:>9.2e}  {verdict}"
        )
    tol = rows[0].tol if rows else None
    if tol:
        lines.append(
            f"tolerance ({rows[0].cfg.dtype}): loss {tol.loss:g}, grad {tol.grad:g}, param "
            + (f"|diff| <= {tol.param_absolute_per_step:g} x step" if tol.param_absolute_per_step else f"{tol.param:g}")
            + f"; {tol.why}"
        )
    return "\n".join(lines)
