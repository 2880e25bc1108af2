"""`jaxdp inspect`: what a strategy's compiled training step does, read from the program itself.

For one run configuration: every collective of the compiled (post-optimisation) step in program
order, with `op` (all-reduce, reduce-scatter, all-gather, collective-permute, all-to-all), `dtype`,
`elements` (of its result), `group_size` (the devices in its replica group; a collective-permute: in the
largest set its pairs connect), `inter_group` (whether a group of it spans hsdp's shard groups of
S = N / R devices), `bytes_per_device` (what one device sends for one run of it, counted
as `accounting.collectives` does: ring algorithms) and `trips` (the times it runs per step: inside
a loop, the loop's trip count); the totals `bytes_per_device` (the sum of bytes_per_device x trips)
and `theory_bytes_per_device` (`accounting.theory`), `replicas` (R) and that total split into
`bytes_intra_group` and `bytes_inter_group`, next to `theory_bytes_intra_group` and
`theory_bytes_inter_group` (`accounting.group_theory_for`; R = 1: all within); the memory per device `state_bytes`,
`temp_bytes` and `peak_bytes` (`accounting.step_memory`); for ddp-bucket, the plan as `buckets`
(elements per bucket, in the order they are all-reduced). A model with running statistics
(BatchNorm) advances them in a second, forward-only program (jaxdp/strategies/stats.py): its bytes are
not the train step's, and are given apart as `stats_bytes_per_device` (measured from its compiled HLO)
and `stats_theory_bytes_per_device` (`accounting.stats_theory`). These keys are a contract: scripts
read them from `--json`. The -jit strategies add `axis_type` ("auto" or "explicit": their mesh's AxisType).
"""
from __future__ import annotations

import jax
import numpy as np

from .. import models
from ..core import atomic
from ..core.config import JIT_STRATEGIES
from ..core.registry import strategies as registry
from ..strategies import bucket
from . import accounting


def inspect(cfg, step: accounting.CompiledStep | None = None, target: str | None = None, nodes: int = 1) -> dict:
    """The contract's dictionary for `cfg`'s compiled training step (the one `jaxdp train` runs);
    `step`: that step already compiled (`accounting.compile_step(cfg)`; with `target`, `aot.TargetStep`); `target`
    (--target): compiled for --devices GPUs of that kind on `nodes` nodes instead, read with its schedule
    (`gpu_program.describe`) and its contract (`_read_target`), once: `program_cache` keeps the reading (unless
    `step` is given), and the projection is made from it (`calibration`)."""
    if target is not None:
        from ..core import targets
        from . import calibration, gpu_program, program_cache

        if step is not None:
            out, found, cached = gpu_program.describe(_read_target(cfg, step), step), step.kernels, {"hit": False}
        else:
            out, found, cached = program_cache.compiled(cfg, target, nodes, _read_target)
        out["projection"] = calibration.reproject(out, targets.TARGETS[target], found, cfg)
        return {**out, "cache": cached}
    return _read(cfg, step or accounting.compile_step(cfg))


def _read(cfg, step) -> dict:
    problem, compiled = step.problem, step.program
    found = accounting.collectives(compiled.as_text(), cfg.devices)
    shard = cfg.devices // cfg.replicas
    ops = [{"op": c["op"], "dtype": c["dtype"], "elements": c["elements"], "group_size": c["group"],
            "inter_group": accounting.crosses_groups(c, shard), "bytes_per_device": c["sent"], "trips": c["trips"]}
           for c in found]
    shapes = [tuple(p.shape) for p in jax.tree.leaves(problem.params)]
    sizes = [int(np.prod(s)) for s in shapes]
    root = accounting.root_sizes(problem)  # zero3: a tied weight, gathered once per micro-batch
    channels = accounting.batchnorm_channels(problem)  # BatchNorm: its statistics' all-reduces
    out = {"strategy": cfg.strategy, "devices": cfg.devices, "model": cfg.model, "dtype": cfg.dtype,
           "accum": cfg.accum, "collectives": ops,
           "bytes_per_device": sum(c["bytes_per_device"] * (c["trips"] or 1) for c in ops),
           "theory_bytes_per_device": accounting.theory_for(cfg, sizes, root, channels, shapes)["total"],
           "replicas": cfg.replicas, **accounting.group_bytes(found, cfg.devices, cfg.replicas),
           **{f"theory_{k}": v for k, v in accounting.group_theory_for(cfg, sizes, root, channels, shapes).items()},
           **accounting.step_memory(compiled)}
    if step.stats_program is not None:  # the running statistics' own program, next to the train step
        stats_ops = accounting.collectives(step.stats_program.as_text(), cfg.devices)
        out["stats_bytes_per_device"] = sum(c["sent"] * (c["trips"] or 1) for c in stats_ops)
        out["stats_theory_bytes_per_device"] = accounting.stats_theory_for(cfg, step.stats_sizes, channels)["total"]
    if cfg.strategy in JIT_STRATEGIES:  # what the partitioner emitted depends on the mesh's AxisType
        out["axis_type"] = cfg.axis_type
    if "bucket_mb" in registry.entry(cfg.strategy).jax_options:  # ddp-bucket
        named = models.flat_names(problem.params)
        out["buckets"] = [sum(int(named[name].size) for name in b) for b in bucket.plan(problem, cfg.bucket_mb)]
    return out


def format_inspect(r: dict) -> str:
    axis = f", axis type {r['axis_type']}" if "axis_type" in r else ""
    lines = [f"{r['strategy']} on {r['devices']} devices ({r['model']}, {r['dtype']}, accum {r['accum']}{axis}): "
             f"{len(r['collectives'])} collectives in program order",
             f"  {'#':>3} {'op':<19} {'dtype':<9} {'elements':>10} {'group':>5} {'bytes/device':>13} {'trips':>5}"]
    lines += [f"  {i:>3} {c['op']:<19} {c['dtype']:<9} {c['elements']:>10} "
              f"{str(c['group_size']) + ('x' if c['inter_group'] else ''):>5} {c['bytes_per_device']:>13.0f} "
              f"{c['trips'] if c['trips'] is not None else '?':>5}" for i, c in enumerate(r["collectives"])]
    lines.append(f"sent per device per step: {r['bytes_per_device']:.0f} bytes "
                 f"(theory {r['theory_bytes_per_device']:.0f})")
    if r["replicas"] > 1:
        s = r["devices"] // r["replicas"]
        lines.append(f"  within a group of {s} (intra): {r['bytes_intra_group']:.0f} bytes "
                     f"(theory {r['theory_bytes_intra_group']:.0f}); across the {r['replicas']} groups (inter, "
                     f"marked x): {r['bytes_inter_group']:.0f} (theory {r['theory_bytes_inter_group']:.0f})")
    if "stats_bytes_per_device" in r:
        lines.append(f"running statistics' program: {r['stats_bytes_per_device']:.0f} bytes per device per step "
                     f"(theory {r['stats_theory_bytes_per_device']:.0f})")
    lines.append(f"bytes per device: state {r['state_bytes']}, temp {r['temp_bytes']}, peak {r['peak_bytes']} "
                 "(state + temp + unaliased outputs)")
    looped = [c for c in r["collectives"] if (c["trips"] or 0) > 1]
    if looped:
        lines.append(f"inside a loop (trips > 1): {len(looped)} collective(s), "
                     f"{sum(c['bytes_per_device'] * c['trips'] for c in looped):.0f} bytes per device per step")
    if "buckets" in r:
        lines.append(f"buckets (elements, in the order reduced): {r['buckets']}")
    return "\n".join(lines)


def _read_target(cfg, step) -> dict:
    """A target step's reading with its contract (kept together in the program cache)."""
    from ..contract import strategies as contract

    return {**_read(cfg, step), "contract": contract.of_compiled(step, cfg).to_dict()}


def main(cfg, json_path: str | None = None, target: str | None = None, nodes: int = 1) -> int:
    from ..contract import strategies as contract
    from ..core.contract.report import Report

    if target is not None:  # the reading and its contract from the program cache, or compiled once
        result = inspect(cfg, None, target, nodes)
    else:
        step = accounting.compile_step(cfg)
        result = {**inspect(cfg, step), "contract": contract.of_compiled(step, cfg).to_dict()}
    report = Report.from_dict(result["contract"])  # the textbook beside the program (docs/CHECK.md)
    print(format_inspect(result) + "\n" + report.to_text())
    if target is not None:
        from . import gpu_program

        print(gpu_program.format_target(result))
    if json_path:
        atomic.write_json(json_path, result, indent=1)
        print(f"wrote {json_path}")
    return 0
