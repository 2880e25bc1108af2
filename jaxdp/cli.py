"""`jaxdp train | diff`: the command line. Flags come from `jaxdp.config.RunConfig`."""
from __future__ import annotations

import argparse
import sys

from . import config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxdp", description="Data parallelism in JAX, checked against PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train one strategy and optionally write its trace")
    config.add_arguments(train)
    train.add_argument("--trace", default=None, help="write the trace (.npz) to this path")
    train.add_argument("--progress", default=None, action=argparse.BooleanOptionalAction,
                       help="progress bar (default: when stderr is a terminal)")

    memory = sub.add_parser("memory", help="per-device bytes of params, grads and optimizer state vs the ZeRO formula")
    config.add_arguments(memory)
    memory.add_argument("--strategies", default="ddp,zero1,zero2,zero3", help="comma-separated strategies")

    diff = sub.add_parser("diff", help="worst relative error per field of trace A against reference B")
    diff.add_argument("a")
    diff.add_argument("b")
    diff.add_argument("--tolerance", type=float, default=None, help="exit 1 when any field exceeds it")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from .devices import DeviceError
    from .trace import TraceError
    from .train import NonFiniteLoss

    try:
        if args.command == "train":
            return _train(args)
        if args.command == "memory":
            return _memory(args)
        return _diff(args)
    except (config.ConfigError, DeviceError, TraceError, NonFiniteLoss) as e:
        print(f"jaxdp: error: {e}", file=sys.stderr)
        return 2


def _train(args) -> int:
    from . import train

    cfg = config.from_args(args)
    result = train.run(cfg, trace_path=args.trace, progress=args.progress)
    print(train.summary(result) + (f"; trace: {args.trace}" if args.trace else ""))
    return 0


def _memory(args) -> int:
    from . import accounting

    base = config.from_args(args)
    rows = [accounting.memory(base.replace(strategy=name.strip()).validate()) for name in args.strategies.split(",")]
    print(f"bytes per device, {base.model} (Psi = {rows[0]['psi']} parameters), {base.optimizer} "
          f"(K = {rows[0]['k_bytes']} bytes/param), {base.dtype}, N = {base.devices}")
    print(accounting.format_memory(rows))
    return 0


def _diff(args) -> int:
    from . import trace

    result = trace.diff(trace.load(args.a), trace.load(args.b))
    print(trace.format_diff(result, args.tolerance))
    if args.tolerance is not None and max(result["worst"].values()) > args.tolerance:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
