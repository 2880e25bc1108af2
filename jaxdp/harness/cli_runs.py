"""`jaxdp memory`, `inspect`, `compare`, `parity` and `bench`: each checks every input (the run flags
for every listed strategy in each framework it runs, and its paths) before any device is made."""
from __future__ import annotations

import os
import sys
import time

from ..core.files import paths
from ..core.registry import strategies as registry
from ..core.run import argv, config


def memory(args) -> int:
    argv.check_target(args)
    if args.json is not None:
        paths.output_file(args.json, "--json")
    untyped = "devices" not in argv.given(args)  # compare's default (cli._compare_devices); single on its one
    cfgs = argv.configs(args, single_on_one=untyped)
    if args.target is not None:
        from ..analysis import target_memory

        return target_memory.main(cfgs, args.target, args.nodes, args.json)
    from ..analysis import accounting

    if untyped and cfgs[0].platform == "auto" and not _accelerators(args.devices):
        cfgs = [c.replace(platform="cpu") for c in cfgs]  # the default 4 devices, simulated: as compare's
    rows = [accounting.memory(cfg) for cfg in cfgs]
    base = cfgs[0]
    print(f"bytes per device, {base.model} (Psi = {rows[0]['psi']} parameters), {base.optimizer} "
          f"(K = {rows[0]['k_bytes']} bytes/param), {base.dtype}, "
          f"N = {', '.join(str(n) for n in sorted({c.devices for c in cfgs}))}")
    print(accounting.format_memory(rows))
    if args.json:
        from ..core.files import atomic

        atomic.write_json(args.json, rows, indent=1)
        print(f"wrote {args.json}")
    return 0


def inspect(args) -> int:
    from ..analysis import inspect as inspect_mod
    from .cli_train import outputs

    argv.check_target(args)
    cfgs = argv.configs(args)
    jsons = outputs(args.json, [c.strategy for c in cfgs], "--json", "{strategy}.json")
    for cfg in cfgs:
        inspect_mod.main(cfg, jsons[cfg.strategy], args.target, args.nodes)
    return 0


def _base(args, names) -> config.RunConfig:
    """The shared configuration (strategy ddp), after checking every listed strategy in each framework."""
    from ..judge.parity import pairs_for

    pairs = pairs_for(names)
    args.runs = [("jax", j) for _, j, _ in pairs] + [("torch", t) for _, _, t in pairs]
    for framework, side in (("jax", 1), ("torch", 2)):
        argv.configs(args, framework, list(dict.fromkeys(p[side] for p in pairs)), single_on_one=True)
    return config.RunConfig(**{k: getattr(args, k) for k in config.RunConfig.__dataclass_fields__
                               if k != "strategy" and hasattr(args, k)}, strategy=registry.DEFAULT)


def _single_on_one(args, names, untyped: bool) -> None:
    """single runs on one device: alone, compare's default --devices becomes 1 and another is refused; with
    others, every strategy runs on the same --devices, so one other than 1 is refused (both before any work)."""
    ones = [s for s in names if registry.on_one_device(s)]
    alone = bool(ones) and len(set(names)) == len(set(ones))
    if untyped and alone:  # compare's default --devices (cli._compare_devices)
        args.devices = 1
    if not ones or args.devices == 1:
        return
    if alone:
        raise config.ConfigError(f"strategy {ones[0]!r} runs on one device; got --devices {args.devices} "
                                 f"(use --devices 1)")
    raise config.ConfigError(
        f"--strategies {','.join(names)}: compare runs every strategy on the same --devices {args.devices}, and "
        f"single runs on one device: compare single apart (--strategies single), or all of them on --devices 1")


def compare(args) -> int:
    from .report.names import check_strategies

    t0 = time.time()
    names = args.strategies
    check_strategies(names)
    argv.check_target(args)
    paths.output_dir(args.out, "--out")
    untyped = "devices" not in argv.given(args)
    _single_on_one(args, names, untyped)
    kernels = args.kernels  # compare's --kernels: a list of paths (kernel_paths); each checked in both frameworks
    for path in reversed(kernels):  # the first path's last: the report's base
        args.kernels = path
        base = _base(args, names)

    def say(message):
        return print(f"[{time.time() - t0:6.1f}s] {message}", file=sys.stderr, flush=True)

    say(f"jaxdp compare: {', '.join(names)} in jaxdp and torch_ref, {base.model}, {base.steps} steps; loading JAX")
    from .. import devices  # the inputs are checked: the heavy imports (JAX, matplotlib) now, after one line
    from ..contract.strategies import note as contract_note
    from .report import recommend, render, runner

    if untyped and base.platform == "auto" and not _accelerators(base.devices):
        base = base.replace(platform="cpu")  # the default 4 devices, simulated: not the 1 or 2 GPUs present
    devices.setup(base.devices, base.platform)

    summary = runner.compare(base, names, progress=say, started=t0, target=args.target, nodes=args.nodes,
                             kernels=kernels[1:])
    say("drawing figures and writing the report")
    written = render.write(summary, args.out)
    for e in summary["strategies"]:
        p = e["parity"]
        print(f"{e['name']:<12} parity {'pass' if p['pass'] else 'FAIL'} (worst grad {p['worst']['grad']:.1e}, "
              f"param {p['worst']['param']:.1e}); comm JAX {e['frameworks']['jax']['comm']['total'] / 1024:.1f} "
              f"KiB/step" + render.finding(e) + contract_note(e["frameworks"]["jax"]["contract"]))
    for r in summary["paths"][len(summary["strategies"]):]:  # the further kernel paths (report.paths)
        print(f"{r['name']:<12} parity {'pass' if r['pass'] else 'FAIL'} on the {r['kernels']} path (worst grad "
              f"{r['worst']['grad']:.1e}); step ms JAX {1e3 * r['jax']['median_step_s']:.2f}, torch "
              f"{1e3 * r['torch']['median_step_s']:.2f}")
    print("\n".join(recommend.as_lines(written["recommendation"])))  # the report's "Which strategy", in short
    print(f"report: {written['html']} ({written['md']}, {written['json']}) in {time.time() - t0:.0f}s")
    return 0 if all(r["pass"] for r in summary["paths"]) else 1


def _accelerators(n: int) -> bool:
    """Does JAX's default backend have n devices (asked after n simulated CPU devices are requested)?"""
    import jax

    from .. import devices

    devices.request_cpu_devices(n)
    return len(jax.devices()) >= n


def parity(args) -> int:
    from .. import devices
    from ..judge import parity as parity_mod

    names = args.strategies
    base = _base(args, names)
    pairs = parity_mod.pairs_for(names)
    devices.setup(base.devices, base.platform)
    from . import pair_runs

    rows = pair_runs.check(base, pairs)
    print(f"jaxdp vs torch_ref: {base.model}/{base.data}, {base.optimizer}, {base.dtype}, {base.steps} steps, "
          f"batch {base.batch_size}, accum {base.accum}, clip {base.clip_norm}, {base.devices} devices, kernels "
          f"{base.kernels}{' (torch compiled)' if base.compile else ''}")
    print(parity_mod.format_table(rows))
    return 0 if all(r.ok for r in rows) else 1


def bench(args) -> int:
    from . import bench as bench_mod

    paths.output_dir(args.out, "--out")
    results = bench_mod.run(quick=args.quick, out=args.out, kernels=args.kernels, compile=args.compile)
    table = bench_mod.write(results, args.out)  # bench.json and bench.md, both or neither
    print(table)
    print(f"wrote {os.path.join(args.out, 'bench.json')} and bench.md")
    return 0
