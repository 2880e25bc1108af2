"""`python -m torch_ref train` (torch_ref/__main__.py): the run flags of `jaxdp train` (from
`jaxdp.core.run.argv`, defined once for both), the same checks and messages before any rank starts, the
same trace format, from the JAX side's initial parameters (`torch_run.py`). Runs under torchrun
unchanged (it reads RANK, WORLD_SIZE, MASTER_ADDR, ...)."""
from __future__ import annotations

import os
import sys

from ..core.errors import EPILOG, EXIT_FAILED, ConfigError, RunFailed, exit_status, one_line
from ..core.files import disk_full
from ..core.process import heartbeat
from ..core.registry import strategies as registry
from ..core.run import argv, config, hsdp_hosts
from .interrupt import guarded, stdout_closed

DIFFERS = ("Differs from `jaxdp train`: each rank is a process holding one device, so --devices N starts N processes "
           "on this machine (--processes, if given, must be N); several hosts come from torchrun, not --coordinator; "
           "--pg-timeout bounds each collective.")


def build_parser() -> argv.Parser:
    parser = argv.Parser(prog="torch_ref", description="The PyTorch reference of jaxdp's strategies.", epilog=EPILOG)
    argv.add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=argv.Parser)
    train = argv.subcommand(sub, "train", help="train one strategy and optionally write its trace",
                            description="Train with one data-parallel strategy in torch.distributed. " + DIFFERS)
    argv.add_run_arguments(train)
    argv.add_strategies(train, registry.DEFAULT, config.FRAMEWORK_STRATEGIES["torch"],
                        "the data-parallel strategy (fsdp is an alias of zero3)")
    argv.add_trace(train, " (rank 0)")
    argv.add_force(train)
    argv.add_processes(train)  # a rank holds one device: P can only be --devices (_check_processes)
    argv.add_timeout(train, "the launcher")
    argv.add_heartbeat(train)
    train.add_argument("--pg-timeout", type=float, default=300.0, metavar="SECONDS", action=argv.Store,
                       help="process group: a collective that waits longer fails (default: %(default)s)")
    return parser


def check(args) -> list:
    """Every input of `torch_ref train`, before any rank starts: the configurations, paths, timeouts, machine."""
    from .cli_train import check_checkpoints, outputs

    cfgs = argv.configs(args, framework="torch")
    _check_processes(args.processes if "processes" in argv.given(args) else None, cfgs[0].devices)
    args.trace_paths = outputs(args.trace, [c.strategy for c in cfgs])
    check_checkpoints(cfgs, "torch")
    argv.check_seconds(args, ("timeout", "pg_timeout", "heartbeat", "startup_timeout"))
    from torch_ref.launch import check_platform  # torch itself: after the checks that need none (in a second)

    check_platform(cfgs[0].platform, cfgs[0].devices)
    for cfg in cfgs:
        note = hsdp_hosts.one_group(cfg)
        if note and os.environ.get("RANK", "0") == "0":  # under torchrun: rank 0 alone
            print(f"torch_ref: note: {note}", file=sys.stderr, flush=True)
        if registry.entry(cfg.strategy).grid:  # hsdp: torchrun's hosts, before any rank works
            local = int(os.environ.get("LOCAL_WORLD_SIZE", cfg.devices))
            hosts = max(1, cfg.devices // local)
            hsdp_hosts.check_hosts(cfg.devices, cfg.replicas, hosts, cfg.hsdp_hosts, "torchrun --nnodes")
    return cfgs


def _check_processes(processes: int | None, devices: int) -> None:
    """--processes P: N ranks are N processes, so P must be --devices N (one line naming torchrun otherwise)."""
    if processes is None or processes == devices:
        return
    if os.environ.get("WORLD_SIZE"):
        raise ConfigError(f"--processes {processes}: under torchrun the processes are torchrun's "
                          f"(--nnodes, --nproc-per-node): drop --processes")
    raise ConfigError(f"--processes {processes} with --devices {devices}: a torch_ref rank is one process holding one "
                      f"device, so --devices N starts N processes: give --devices {processes} (or drop --processes); "
                      f"for several hosts, torchrun --nnodes H --nproc-per-node N/H -m torch_ref train ...")


def _train(args) -> int:
    cfgs = check(args)  # before torch is imported: a refusal in about a second
    from torch_ref.train import summary

    from .torch_run import run

    for cfg in cfgs:
        path = args.trace_paths[cfg.strategy]
        result = run(cfg, trace_path=path, timeout_s=args.timeout, pg_timeout_s=args.pg_timeout,
                     heartbeat_s=args.heartbeat)
        if result is not None:  # rank 0
            print(summary(result) + (f"; trace: {path}" if path else ""))
    return 0


def _rank_error() -> type[BaseException]:
    """torch_ref.launch's RankError once a rank has started (torch imported), else an error nothing raises."""
    launch = sys.modules.get("torch_ref.launch")
    return launch.RankError if launch is not None else _NotRaised


class _NotRaised(Exception):
    """No rank started: no RankError."""


@guarded("torch_ref")  # Ctrl-C: one line and status 130 (interrupt.py)
def main(argv_=None) -> int:
    args = build_parser().parse_args(argv_)
    try:
        config.require_torch("python -m torch_ref")
    except ConfigError as e:
        print(f"torch_ref: error: {e}", file=sys.stderr)
        return 2
    from ..core.files.record import CheckpointError  # torch_ref.checkpoint's, without importing torch
    from ..core.traces.trace import TraceError

    answered = (ConfigError, TraceError, CheckpointError, RunFailed, OSError)  # errors.exit_status: 2 or 3
    try:
        with heartbeat.configured(args.heartbeat, args.startup_timeout):  # the launches' limits, put back after
            return _train(args)
    except answered as e:
        if isinstance(e, BrokenPipeError) and stdout_closed():
            raise  # stdout's reader has gone: a quiet end (interrupt.guarded), not an error line
        print(f"torch_ref: error: {one_line(e)}", file=sys.stderr)
        return exit_status(e)
    except _rank_error() as e:
        full = disk_full.find(e.cause) if e.cause is not None and not isinstance(e.cause, answered) else None
        if isinstance(e.cause, answered) or full is not None:
            print(f"torch_ref: error: rank {e.rank}: {disk_full.line(full) if full else one_line(e.cause)}",
                  file=sys.stderr)
            return EXIT_FAILED if full else exit_status(e.cause)
        if e.traceback:
            print(e.traceback, file=sys.stderr)
        print(f"torch_ref: error: {e}", file=sys.stderr)
        return EXIT_FAILED  # a crashed or stopped rank
    except TimeoutError as e:  # a hung rank
        print(f"torch_ref: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except BaseException as e:  # a full disk inside a library's own exception (DCP's): its one line
        full = disk_full.find(e)
        if full is None:
            raise
        print(f"torch_ref: error: {disk_full.line(full)}", file=sys.stderr)
        return EXIT_FAILED
