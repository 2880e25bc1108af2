"""The `jaxdp` command line: `train`, `diff`, `memory`, `inspect`, `parity`, `compare`, `bench` (see `jaxdp -h`).
Training flags come from `jaxdp.config.RunConfig`, the one definition both frameworks use."""
from __future__ import annotations

import argparse
import os
import sys

from ..core import config, hsdp_hosts
from . import cli_diff
from .interrupt import guarded


def _strategy_list(text: str) -> list[str]:
    names = [config.ALIASES.get(n.strip(), n.strip()) for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in config.ALL_STRATEGIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"invalid choice: {bad[0] if bad else text!r} "
            f"(choose from {', '.join(config.ALL_STRATEGIES + tuple(config.ALIASES))})"
        )
    return names


TORCH_COMMANDS = ("compare", "parity", "bench")  # they run torch_ref too


def _add_train(sub) -> None:
    train = sub.add_parser(
        "train", help="train one strategy and optionally write its trace", conflict_handler="resolve"
    )
    config.add_arguments(train)
    train.add_argument(
        "--strategy",
        dest="strategy",
        default="ddp",
        type=_strategy_list,
        help="strategy, or several comma-separated (run one after another; put {strategy} in --trace)",
    )
    train.add_argument("--trace", default=None, help="write the trace (.npz) to this path")
    multi = train.add_argument_group("multi-process (jax.distributed)")
    multi.add_argument("--processes", type=int, default=1,
                       help="start this many processes on this machine (coordinator on a free loopback port)")
    multi.add_argument("--coordinator", default=None, help="HOST:PORT of process 0's coordinator (cluster runs)")
    multi.add_argument("--num-processes", type=int, default=None, help="processes in all (cluster runs)")
    multi.add_argument("--process-id", type=int, default=None, help="this process's index (cluster runs)")
    multi.add_argument("--timeout", type=float, default=None, help="--processes: stop the run after this many seconds")
    train.add_argument("--progress", default=None, action=argparse.BooleanOptionalAction,
                       help="progress bar (default: when stderr is a terminal)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxdp", description="Data parallelism in JAX, checked against PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True)

    _add_train(sub)
    memory = sub.add_parser("memory", help="per-device bytes of params, grads and optimizer state vs the ZeRO formula")
    config.add_arguments(memory)
    memory.add_argument("--strategies", default="ddp,zero1,zero2,zero3", help="comma-separated strategies")

    inspect = sub.add_parser("inspect", help="every collective of the compiled step, bytes vs theory, peak memory")
    config.add_arguments(inspect)
    inspect.add_argument("--json", default=None, metavar="PATH", help="also write the result as JSON here")

    compare = sub.add_parser("compare", help="run strategies in both frameworks and write the comparison report")
    config.add_arguments(compare)
    compare.add_argument("--strategies", default="ddp,ddp-ring,zero1,zero3", help="comma-separated strategies")
    compare.add_argument(
        "--out", default="reports/compare", help="folder for report.html, report.md, summary.json, PNGs"
    )

    bench = sub.add_parser("bench", help="benchmarks, side by side in one run: writes bench.json and bench.md")
    bench.add_argument("--quick", action="store_true", help="tiny sizes and few repeats (a smoke run)")
    bench.add_argument("--out", default="reports/bench", help="folder for bench.json and bench.md")

    parity = sub.add_parser("parity", help="train each strategy in jaxdp and torch_ref and compare them step by step")
    config.add_arguments(parity)
    parity.add_argument("--strategies", default="single,dp,ddp,ddp-bucket,ddp-ring,zero1,zero2,zero3,ddp-pmap,"
                        "ddp-naive", help="comma-separated; a name both sides have, ddp-pmap / ddp-naive (against "
                        "ddp), or JAX~TORCH")

    cli_diff.add_parser(sub)
    return parser


@guarded("jaxdp")  # Ctrl-C: one line and status 130 (interrupt.py)
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from ..checkpoint import CheckpointError
    from ..core.trace import TraceError
    from ..devices import DeviceError
    from ..train import NonFiniteLoss

    try:
        if args.command in TORCH_COMMANDS:
            config.require_torch(f"jaxdp {args.command}")
        if args.command == "train":
            return _train(args)
        if args.command == "memory":
            return _memory(args)
        if args.command == "inspect":
            return _inspect(args)
        if args.command == "parity":
            return _parity(args)
        if args.command == "compare":
            return _compare(args)
        if args.command == "bench":
            return _bench(args)
        return cli_diff.main(args)
    except (config.ConfigError, DeviceError, TraceError, NonFiniteLoss, CheckpointError) as e:
        print(f"jaxdp: error: {e}", file=sys.stderr)
        return 2


def _train(args) -> int:
    from .. import devices, train
    from ..core import trace

    strategies = args.strategy
    if len(strategies) > 1 and args.trace and "{strategy}" not in args.trace:
        raise config.ConfigError(
            "several strategies write several traces: put {strategy} in --trace, e.g. runs/{strategy}.npz"
        )
    hsdp_hosts.check_listed(args.replicas, strategies, "--strategy", args.hsdp_hosts)
    configs = [config.from_args(argparse.Namespace(**{**vars(args), "strategy": name} | (
        {} if name == "hsdp" else {"replicas": 1, "hsdp_hosts": "shard"}))) for name in strategies]
    for cfg in configs:  # before training (and before starting processes), not when the trace is due
        if args.trace:
            trace.check_writable(args.trace.format(strategy=cfg.strategy))
    _check_processes(args.processes, args.devices)
    for cfg in configs:
        if cfg.strategy == "hsdp":
            hsdp_hosts.check_hosts(cfg.devices, cfg.replicas, args.num_processes or args.processes, cfg.hsdp_hosts)
    if args.processes > 1:
        if args.coordinator:
            raise config.ConfigError(
                "--processes starts local processes; on a cluster give --coordinator, "
                "--num-processes and --process-id to each process instead"
            )
        from .. import launch

        return launch.launch(_argv_without_processes(), args.processes, args.timeout)
    distributed = devices.Distributed.from_env()
    if args.coordinator or args.num_processes or args.process_id is not None:
        if not (args.coordinator and args.num_processes and args.process_id is not None):
            raise config.ConfigError("a cluster run needs all three of --coordinator, --num-processes and --process-id")
        distributed = devices.Distributed(args.coordinator, args.num_processes, args.process_id)
    try:
        for cfg in configs:
            path = args.trace.format(strategy=cfg.strategy) if args.trace else None
            result = train.run(cfg, trace_path=path, progress=args.progress, distributed=distributed)
            if distributed is None or distributed.process_id == 0:
                print(train.summary(result) + (f"; trace: {path}" if path else ""), flush=True)
    except BaseException as e:
        if distributed is None:
            raise
        # Exit now: jax.distributed's exit-time barrier would otherwise wait for the other
        # processes, which wait for this one. The launcher (or cluster) sees the status at once.
        import traceback

        print(f"jaxdp: error: process {distributed.process_id}: {type(e).__name__}: {e}", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(2 if isinstance(e, config.ConfigError) else 1)
    return 0


def _check_processes(processes: int, devices: int) -> None:
    """Every process contributes devices / processes devices: check before starting any."""
    if processes < 1:
        raise config.ConfigError(f"--processes must be at least 1, got {processes}")
    if devices % processes:
        fits = ", ".join(str(p) for p in range(1, devices + 1) if devices % p == 0)
        raise config.ConfigError(
            f"--devices {devices} does not divide over --processes {processes} (each process holds the same "
            f"number of devices); use --processes {fits}, or --devices {processes * (devices // processes + 1)}"
        )


def _argv_without_processes() -> list[str]:
    argv, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
            continue
        if a in ("--processes", "--timeout"):
            skip = True
            continue
        if a.startswith(("--processes=", "--timeout=")):
            continue
        argv.append(a)
    return argv


def _memory(args) -> int:
    from ..analysis import accounting

    names = [n.strip() for n in args.strategies.split(",") if n.strip()]
    hsdp_hosts.check_listed(args.replicas, names, hosts=args.hsdp_hosts)
    base = config.from_args(argparse.Namespace(**{**vars(args), "replicas": 1, "hsdp_hosts": "shard"}))
    rows = [accounting.memory(hsdp_hosts.per_strategy(base.replace(replicas=args.replicas, hsdp_hosts=args.hsdp_hosts),
                                                      name).validate()) for name in names]
    print(
        f"bytes per device, {base.model} (Psi = {rows[0]['psi']} parameters), {base.optimizer} "
        f"(K = {rows[0]['k_bytes']} bytes/param), {base.dtype}, N = {base.devices}"
    )
    print(accounting.format_memory(rows))
    return 0


def _inspect(args) -> int:
    from ..analysis import inspect
    from ..core import trace

    if args.json:
        trace.check_writable(args.json, "--json")
    return inspect.main(config.from_args(args), args.json)


def _compare(args) -> int:
    import time

    from .. import devices
    from ..core import trace
    from .report import render, runner

    names = [config.ALIASES.get(n.strip(), n.strip()) for n in args.strategies.split(",") if n.strip()]
    runner.check_strategies(names)
    trace.check_writable(os.path.join(args.out, "report.html"), "--out")
    base = config.RunConfig(
        **{**{k: getattr(args, k) for k in config.RunConfig.__dataclass_fields__}, "strategy": "ddp"}
    )
    devices.setup(base.devices, base.platform)
    t0 = time.perf_counter()

    def say(message):
        return print(f"[{time.perf_counter() - t0:6.1f}s] {message}", file=sys.stderr, flush=True)

    summary = runner.compare(base, names, progress=say)
    say("drawing figures and writing the report")
    paths = render.write(summary, args.out)
    for e in summary["strategies"]:
        p = e["parity"]
        print(
            f"{e['name']:<12} parity {'pass' if p['pass'] else 'FAIL'} (worst grad {p['worst']['grad']:.1e}, "
            f"param {p['worst']['param']:.1e}); comm JAX {e['frameworks']['jax']['comm']['total'] / 1024:.1f} KiB/step"
            + render.finding(e)
        )
    print(f"report: {paths['html']} ({paths['md']}, {paths['json']}) in {time.perf_counter() - t0:.0f}s")
    return 0 if all(e["parity"]["pass"] for e in summary["strategies"]) else 1


def _bench(args) -> int:
    from ..core import trace
    from . import bench

    trace.check_writable(os.path.join(args.out, "bench.json"), "--out")
    results = bench.run(quick=args.quick, out=args.out)
    table = bench.write(results, args.out)  # bench.json and bench.md, both or neither
    print(table)
    print(f"wrote {os.path.join(args.out, 'bench.json')} and bench.md")
    return 0


def _parity(args) -> int:
    from .. import devices
    from . import parity

    base = config.RunConfig(
        **{**{k: getattr(args, k) for k in config.RunConfig.__dataclass_fields__}, "strategy": "ddp"}
    )
    pairs = parity.pairs_for(n.strip() for n in args.strategies.split(",") if n.strip())
    hsdp_hosts.check_listed(base.replicas, [n for _, j, t in pairs for n in (j, t)], hosts=base.hsdp_hosts)
    for _, j, t in pairs:
        hsdp_hosts.per_strategy(base, j).replace(devices=1 if j == "single" else base.devices).validate("jax")
        hsdp_hosts.per_strategy(base, t).replace(devices=1 if t == "single" else base.devices).validate("torch")
    devices.setup(base.devices, base.platform)
    rows = parity.check(base, pairs)
    print(
        f"jaxdp vs torch_ref: {base.model}/{base.data}, {base.optimizer}, {base.dtype}, {base.steps} steps, "
        f"batch {base.batch_size}, accum {base.accum}, clip {base.clip_norm}, {base.devices} devices"
    )
    print(parity.format_table(rows))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
