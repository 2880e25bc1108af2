"""`jaxdp compare`: run every listed strategy in both frameworks on one configuration, measure
everything, and collect it into `summary.json`'s dictionary (plots and pages are drawn from it).

Per strategy and framework: the losses and the traces (for parity, step by step), the step times
(first step = compilation, one more warm-up step, both excluded from the median and reported
separately), the communication per device per step by collective (JAX: read from the compiled
step's HLO; torch: counted from what the process group ran), and the per-device memory (from the
arrays / tensors each device holds), each next to its theory.
"""
from __future__ import annotations

import datetime
import os
import platform as platform_mod
import sys
import time

import jax
import numpy as np

from ... import train
from ...analysis import accounting
from ...core.registry import strategies as registry
from ...core.run import hsdp_hosts
from ...core.run.config import RunConfig
from ...core.run.timing import timing
from ...core.traces import trace as trace_mod
from ...judge import parity
from . import paths, projection, recommend
from .names import check_strategies  # noqa: F401 (compare's check, runner.check_strategies to its callers)


def flops_per_sample(cfg: RunConfig) -> float:
    """FLOPs of one training step per sample, from XLA's cost analysis of the compiled single-device step."""
    cost = accounting.compile_step(cfg.replace(strategy=registry.ONE_DEVICE, devices=1)).program.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost.get("flops", 0.0)) / cfg.batch_size


THEORY_N = projection.NS[0]  # a run on one device sends nothing: its projection takes the theory's bytes at 8


def jax_accounting(cfg: RunConfig) -> dict:
    """Memory, communication and temporaries of the compiled step (`accounting.measure_step`), with theory."""
    acc = accounting.measure_step(cfg)
    comm, sizes, itemsize = acc["comm"], acc["sizes"], acc["param_bytes"]
    theory = acc["theory"] if cfg.strategy != "dp" else None
    return {
        "memory": acc["measured"],
        "memory_formula": acc["formula"],
        "temp_bytes": acc["temp_bytes"],
        "peak_bytes": acc["peak_bytes"],
        "comm": {k: v["sent"] for k, v in comm.items() if k != "total"} | {"total": comm["total"]},
        "comm_ops": {k: v["ops"] for k, v in comm.items() if k != "total"},
        "comm_theory": theory,
        "psi": acc["psi"],
        "sizes": sizes,
        "itemsize": itemsize,
        "theory_at": accounting.theory_for(cfg.replace(devices=THEORY_N, replicas=1), **acc["theory_inputs"])["total"],
        "contract": acc["contract"],
    }


def _torch_side(rank: int, n: int, jobs: list, started: float | None = None, measure: bool = True) -> list:
    """In each spawned rank: train every configuration (for its trace and step times), then (`measure`) its
    communication and memory (torch_ref.analysis.accounting), all in one world. Rank 0 says each
    strategy's progress on stderr (`started`: the command's start, time.time()), so a long torch side
    is not silent."""
    from torch_ref.analysis import accounting
    from torch_ref.train import train_rank

    out = []
    for i, (cfg, init) in enumerate(jobs):
        if rank == 0:
            _say(started, f"torch_ref: training {cfg.strategy} ({i + 1}/{len(jobs)})")
        out.append((train_rank(rank, n, cfg, init, True), accounting.measure_rank(rank, n, cfg, init) if measure
                    else None))
    return out


def _say(started: float | None, message: str) -> None:
    """A progress line as `jaxdp compare` prints them, from any process (`started`: the command's time.time())."""
    if started is not None:
        print(f"[{time.time() - started:6.1f}s] {message}", file=sys.stderr, flush=True)


def run_torch_side(cfgs: list[RunConfig], timeout_s: float = 900.0, started: float | None = None,
                   measure: bool = True) -> dict:
    """{cfg: (torch_ref RunResult, torch_ref.analysis.accounting summary, None without `measure`)}: one spawned
    world of N ranks."""
    from torch_ref import launch
    from torch_ref.analysis import accounting

    from ... import models
    from ...core.run import data

    n, first = cfgs[0].devices, cfgs[0]
    initial = {}  # one model for every strategy: its initial arrays made once (a config differing in more is not)
    _say(started, "jaxdp: the initial weights both frameworks start from (JAX compiles its first operations)")
    for c in cfgs:
        key = c.replace(strategy=first.strategy, replicas=first.replicas)
        if key not in initial:
            initial[key] = models.initial_arrays(c, data.load(c.data, c.seed, c.seq_len))
    jobs = [(c, initial[c.replace(strategy=first.strategy, replicas=first.replicas)]) for c in cfgs]
    _say(started, f"torch_ref: starting {n} ranks (each imports torch and joins the process group)")
    per_rank = launch.launch(_torch_side, n, jobs, started, measure, platform=cfgs[0].platform, timeout_s=timeout_s,
                             pg_timeout_s=120)
    return {c: (per_rank[0][i][0], accounting.summarise(c, [r[i][1] for r in per_rank]) if measure else None)
            for i, c in enumerate(cfgs)}


def _entry(name: str, c: RunConfig, j, jacc: dict, t, tacc: dict) -> dict:
    """One strategy's summary entry: both frameworks' losses, timing, communication and memory, the
    theory, and the parity of the two traces (j, t: the RunResults; jacc, tacc: their accounting)."""
    row = parity.compare(trace_mod.Trace(j.meta, j.arrays), trace_mod.Trace(t.meta, t.arrays), c, name)
    jax_entry = {
        "losses": j.losses,
        **timing(j.step_times),
        "comm": jacc["comm"],
        "comm_ops": jacc["comm_ops"],
        "memory": jacc["memory"],
        "temp_bytes": jacc["temp_bytes"],
        "peak_bytes": jacc["peak_bytes"],
        "contract": jacc["contract"],  # the compiled step against its layout's textbook (docs/CHECK.md)
    }
    torch_entry = {
        "losses": t.losses,
        **timing(t.step_times),
        "comm": tacc["comm"],
        "comm_ops": tacc.get("comm_ops", {}),
        "memory": tacc["memory"],
        "peak_bytes": tacc.get("peak_bytes"),
        "notes": tacc.get("notes", []),
    }
    theory = {"memory": jacc["memory_formula"]}
    if jacc["comm_theory"] is not None:
        theory["comm"] = jacc["comm_theory"]
    return {
        "name": name,
        "frameworks": {"jax": jax_entry, "torch": torch_entry},
        "theory": theory,
        "parity": {
            "loss": row.per_step["loss"],
            "grad": row.per_step["grad"],
            "param": row.per_step["param"],
            "worst": row.worst,
            "init_identical": row.init_identical,
            "pass": row.ok,
            "failures": row.failures,
        },
    }


BY_DESIGN = "local BatchNorm: differs from single by design"


def by_design_reference(cfg: RunConfig, say):
    """jaxdp `single` on the whole batch, when the configuration is meant to differ from it: local
    BatchNorm statistics on more than one device (each device normalises by its own rows, as torch
    DDP does by default). None otherwise."""
    if getattr(cfg, "batchnorm", "sync") != "local" or cfg.devices == 1 or "cnn" not in cfg.model:
        return None
    say("jaxdp: training single on one device (local BatchNorm differs from it by design: measured, not failed)")
    return train.run(cfg.replace(strategy=registry.ONE_DEVICE, devices=1), record=True, progress=False)


def versus_single(j, reference, c: RunConfig, name: str) -> dict:
    """How far a strategy's trace is from `single`'s: a finding reported next to the verdict."""
    row = parity.compare(trace_mod.Trace(j.meta, j.arrays), trace_mod.Trace(reference.meta, reference.arrays), c,
                         f"{name}~single")
    return {"finding": BY_DESIGN, "differs": not row.ok, "worst": row.worst}


def compare(cfg: RunConfig, strategies: list[str], progress=None, started: float | None = None,
            target: str | None = None, nodes: int = 1, kernels: tuple = ()) -> dict:
    """Run and measure everything; returns the summary dictionary (`progress(message)`: say where it is;
    `started`: the command's start, time.time(), for the torch ranks' own progress lines; `target`: also
    compile each JAX step for --devices GPUs of that kind on `nodes` nodes, its peak in `entries[i]["target"]`,
    which "Which strategy" then reads: `recommend`; `kernels`: further paths, each `run_path`)."""
    check_strategies(strategies)
    hsdp_hosts.check_listed(cfg.replicas, strategies, hosts=cfg.hsdp_hosts)
    say = progress or (lambda message: None)
    cfgs = {s: hsdp_hosts.per_strategy(cfg, s).validate("jax") for s in strategies}
    cfg = hsdp_hosts.per_strategy(cfg, registry.DEFAULT)  # the reference runs and the FLOP count: no --replicas
    for c in cfgs.values():
        c.validate("torch")

    say(f"torch_ref: training and measuring {len(strategies)} strategies on {cfg.devices} ranks (one world)")
    torch_side = run_torch_side(list(cfgs.values()), started=started)
    entries, theory_sent = [], {}
    reference = by_design_reference(cfg, say)
    for name, c in cfgs.items():
        say(f"jaxdp: training {name}")
        j = train.run(c, record=True, progress=False)
        say(f"jaxdp: accounting {name} (compiled HLO, arrays)")
        jacc = jax_accounting(c)
        entries.append(_entry(name, c, j, jacc, *torch_side[c]))
        entries[-1]["layout"] = recommend.layout_of(c.strategy, c.devices // c.replicas, c.axis_type)
        theory_sent[name] = jacc["theory_at"]
        if reference is not None:
            entries[-1]["vs_single"] = versus_single(j, reference, c, name)
        if target is not None:
            say(f"jaxdp: compiling {name} for {c.devices} {target.upper()}s (XLA:GPU, from shapes)")
            entries[-1]["target"] = compiled_for(c, target, nodes)
    measured = cfg.devices > 1  # else nothing was sent: the theory's bytes at THEORY_N (projection.SOURCES)
    say("projection: NCCL network model, reference models with the " + ("measured" if measured else "theory's")
        + " bytes per parameter")
    fps = flops_per_sample(cfg)
    sent = {e["name"]: e["frameworks"]["jax"]["comm"]["total"] for e in entries} if measured else theory_sent
    # jacc: the last strategy's accounting; every strategy trains the same model, so any one's count will do
    proj = projection.for_report(sent, jacc["psi"], jacc["itemsize"], fps, cfg.devices if measured else THEORY_N,
                                 cfg.batch_size, cfg.model, source="measured" if measured else "theory")
    tol = parity.tolerance(cfg)
    return {
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "config": {k: v for k, v in cfg.to_dict().items() if k != "strategy"},
        "devices": cfg.devices,
        "machine": {
            "platform": jax.devices()[0].platform,
            "processor": platform_mod.processor() or platform_mod.machine(),
            "cpu_count": os.cpu_count(),
            "versions": train.versions(),
        },
        "tolerance": tol.grad if np.isfinite(tol.grad) else tol.loss,
        "tolerance_why": tol.why,
        "flops_per_sample": fps,
        "strategies": entries,
        "projection": proj,
        "paths": paths.first(entries, cfg) + [r for k in kernels for r in run_path(cfgs, k, say, started)],
    } | ({"target": {"name": target, "nodes": nodes,
                     "device_memory_bytes": entries[0]["target"]["device_memory_bytes"]}} if target else {})


def run_path(cfgs: dict, kernels: str, say, started: float | None = None) -> list[dict]:
    """compare's further kernel path: every strategy of `cfgs` ({name: RunConfig}) trained again on `kernels` in
    both frameworks (traces, step times; no accounting), judged: `paths.row` per strategy."""
    here = {name: c.replace(kernels=kernels).validate("jax") for name, c in cfgs.items()}
    say(f"torch_ref: training {len(here)} strategies on the {kernels} path (one world)")
    torch_side = run_torch_side([c.validate("torch") for c in here.values()], started=started, measure=False)
    rows = []
    for name, c in here.items():
        say(f"jaxdp: training {name} on the {kernels} path")
        j, (t, _) = train.run(c, record=True, progress=False), torch_side[c]
        judged = parity.compare(trace_mod.Trace(j.meta, j.arrays), trace_mod.Trace(t.meta, t.arrays), c, name)
        rows.append(paths.row(name, c, timing(j.step_times), timing(t.step_times),
                              {"pass": judged.ok, "worst": judged.worst}))
    return rows


def compiled_for(cfg: RunConfig, target: str, nodes: int) -> dict:
    """A strategy's step compiled for the target, once (`analysis.inspect`, through `analysis.program_cache`: a
    shape compiled before is read back): its peak, whether it fits the target's memory as it is now, and its
    projected step (a range, `analysis.calibration`)."""
    from ...analysis import inspect
    from ...core.run import targets

    r = inspect.inspect(cfg, target=target, nodes=nodes)
    memory = targets.TARGETS[target].memory_bytes
    p = r["projection"]
    return {"target": target, "devices": cfg.devices, "nodes": nodes, "peak_bytes": r["peak_bytes"],
            "device_memory_bytes": memory, "fits": r["peak_bytes"] <= memory, "cached": r["cache"]["hit"],
            "projection": {k: p[k] for k in ("step_s", "step_low_s", "step_high_s", "mfu", "calibrated_on")}}
