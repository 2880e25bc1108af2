"""`python -m torch_ref train` (torch_ref/__main__.py): the same flags as `jaxdp train` (from
`jaxdp.core.config.RunConfig`), the same trace format, from the JAX side's initial parameters
(`torch_run.py`). Runs under torchrun unchanged (it reads RANK, WORLD_SIZE, MASTER_ADDR, ...)."""
from __future__ import annotations

import argparse
import os
import sys

from ..core import config, hsdp_hosts
from .interrupt import guarded


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torch_ref", description="The PyTorch reference of jaxdp's strategies.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train one strategy and optionally write its trace")
    config.add_arguments(train)
    train.add_argument("--trace", default=None, help="write the trace (.npz) to this path (rank 0)")
    train.add_argument("--timeout", type=float, default=3600.0,
                       help="launcher: stop every rank after this many seconds (default: %(default)s)")
    train.add_argument("--pg-timeout", type=float, default=300.0,
                       help="process group: a collective that waits longer fails (default: %(default)s)")
    return parser


@guarded("torch_ref")  # Ctrl-C: one line and status 130 (interrupt.py)
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config.require_torch("python -m torch_ref")
    except config.ConfigError as e:
        print(f"torch_ref: error: {e}", file=sys.stderr)
        return 2
    from torch_ref.checkpoint import CheckpointError
    from torch_ref.launch import RankError
    from torch_ref.train import NonFiniteLoss, summary

    from ..core.trace import TraceError, check_writable
    from .torch_run import run

    try:
        cfg = config.from_args(args, framework="torch")
        if cfg.strategy == "hsdp":  # torchrun's hosts (WORLD_SIZE / LOCAL_WORLD_SIZE): before any rank works
            local = int(os.environ.get("LOCAL_WORLD_SIZE", cfg.devices))
            hosts = max(1, cfg.devices // local)
            hsdp_hosts.check_hosts(cfg.devices, cfg.replicas, hosts, cfg.hsdp_hosts, "torchrun --nnodes")
        if args.trace:
            check_writable(args.trace)
        result = run(cfg, trace_path=args.trace, timeout_s=args.timeout, pg_timeout_s=args.pg_timeout)
    except (config.ConfigError, TraceError, NonFiniteLoss, CheckpointError) as e:
        print(f"torch_ref: error: {e}", file=sys.stderr)
        return 2
    except RankError as e:
        if isinstance(e.cause, (config.ConfigError, NonFiniteLoss, CheckpointError)):
            print(f"torch_ref: error: rank {e.rank}: {e.cause}", file=sys.stderr)
            return 2
        print(e.traceback, file=sys.stderr)
        print(f"torch_ref: error: {e}", file=sys.stderr)
        return 1
    except TimeoutError as e:
        print(f"torch_ref: error: {e}", file=sys.stderr)
        return 1
    if result is not None:  # rank 0
        print(summary(result) + (f"; trace: {args.trace}" if args.trace else ""))
    return 0
