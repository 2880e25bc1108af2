"""The `jaxdp` command line: `train`, `diff`, `memory`, `inspect`, `parity`, `compare`, `bench`, `check` (`jaxdp -h`).
The flags come from `jaxdp.core.run.argv` (the run flags from `RunConfig`, the one definition both frameworks
use); every input is checked before any device, process or model is made (`cli_runs.py`, `cli_train.py`)."""
from __future__ import annotations

import contextlib
import os
import sys

from ..contract import cli as cli_check
from ..core import errors
from ..core.files import atomic, disk_full
from ..core.process import heartbeat
from ..core.registry import strategies as registry
from ..core.run import argv, config
from . import check_torch, cli_diff, cli_runs, cli_train, kernel_paths
from .interrupt import guarded, stdout_closed

TORCH_COMMANDS = ("compare", "parity", "bench")  # they run torch_ref too
JAX = config.FRAMEWORK_STRATEGIES["jax"]
BOTH = tuple(s for s in JAX if s in config.FRAMEWORK_STRATEGIES["torch"])
EITHER = config.ALL_STRATEGIES
# RunConfig flags a command does not read: it does not take them (a typed one is refused in one line).
NO_CHECKPOINT = ("checkpoint_dir", "checkpoint_every", "resume", "overwrite_checkpoints")  # compare, parity: in memory
NO_RUN = ("steps", "seed", "nan_check", *NO_CHECKPOINT)  # memory, inspect: no run
PARITY_DEFAULT = "single,dp,ddp,ddp-bucket,ddp-ring,zero1,zero2,zero3,ddp-pmap,ddp-naive"


def _add_train(sub) -> None:
    train = argv.subcommand(sub, "train", help="train one strategy (or several, one after another); optionally "
                            "write its trace", description="Train with one data-parallel strategy. The PyTorch "
                            "twin: python -m torch_ref train, with the same run flags.")
    argv.add_run_arguments(train)
    argv.add_strategies(train, registry.DEFAULT, JAX, "the data-parallel strategy (fsdp is an alias of zero3)")
    argv.add_trace(train)
    argv.add_force(train)
    multi = train.add_argument_group("multi-process (jax.distributed)")
    argv.add_processes(multi)
    multi.add_argument("--coordinator", default=None, metavar="HOST:PORT", action=argv.Store,
                       help="process 0's coordinator (cluster runs; with --num-processes and --process-id)")
    multi.add_argument("--num-processes", type=int, default=None, action=argv.Store,
                       help="processes in all (cluster runs)")
    multi.add_argument("--process-id", type=int, default=None, action=argv.Store,
                       help="this process's index, 0 to --num-processes - 1 (cluster runs)")
    argv.add_timeout(multi, "--processes")
    argv.add_heartbeat(multi)
    train.add_argument("--progress", default=None, action=argv.Switch,
                       help="progress bar (default: when stderr is a terminal)")


def _add_analyses(sub) -> None:
    memory = argv.subcommand(sub, "memory", help="per-device bytes of params, grads and optimizer state vs the "
                             "ZeRO formula", description="Bytes per device of each strategy, measured and in theory.")
    argv.add_run_arguments(memory, exclude=NO_RUN)
    argv.add_strategies(memory, "ddp,zero1,zero2,zero3", JAX, "the strategies to measure")
    argv.add_force(memory)
    argv.add_target(memory)
    _compare_devices(memory, "As compare's: ZeRO's shards are 1/N, so on 1 device they save nothing")
    memory.add_argument("--json", default=None, metavar="PATH", action=argv.Store,
                        help="also write the rows as JSON here ('-': stdout, the table then on stderr) (with --target: "
                        "docs/GPU.md's keys)")

    inspect = argv.subcommand(sub, "inspect", help="every collective of the compiled step, bytes vs theory, peak "
                              "memory", description="Compile one training step and list what it communicates.")
    argv.add_run_arguments(inspect, exclude=NO_RUN)
    argv.add_strategies(inspect, registry.DEFAULT, JAX, "the strategy to compile")
    argv.add_force(inspect)
    inspect.add_argument("--json", default=None, metavar="PATH", action=argv.Store,
                         help="also write the result as JSON here ('-': stdout, the rest then on stderr; several "
                         "strategies: put {strategy} in it)")
    argv.add_target(inspect)


COMPARE_DEVICES = 4


def _compare_devices(parser, why: str = "") -> None:
    """compare's (and memory's) own --devices default (cli_runs.compare and .memory resolve it)."""
    action = next(a for a in parser._actions if a.dest == "devices")
    action.default = COMPARE_DEVICES
    action.help = (f"number of devices (default: {COMPARE_DEVICES}, simulated on the CPU unless {COMPARE_DEVICES} "
                   f"GPUs are present; 1 for {registry.ONE_DEVICE!r}, which runs on one device). " + (why or (
                       "Not 1: one device sends nothing, so nothing about communication could be measured (the "
                       f"report would project from the theory alone); {COMPARE_DEVICES} is the fewest where a ring "
                       f"has more than one neighbour, hsdp has 2 groups of 2 and every shard is at most "
                       f"1/{COMPARE_DEVICES}, and it takes a few minutes on 2 CPU cores")))


def _add_pairs(sub) -> None:
    compare = argv.subcommand(sub, "compare", help="run strategies in both frameworks and write the comparison "
                              "report", description="Each strategy in jaxdp and torch_ref: agreement, memory, "
                              "bytes, time, and which strategy fits where.")
    argv.add_run_arguments(compare, exclude=NO_CHECKPOINT)
    _compare_devices(compare)
    argv.add_strategies(compare, "ddp,ddp-ring,zero1,zero3", EITHER, "the strategies to compare (each must exist "
                        "in both frameworks: " + ", ".join(BOTH) + ")")
    kernel_paths.add(compare, "mirrored", "the report is the first path's; each further path trains every strategy "
                     "again in both frameworks, judged and timed in the report's 'Kernel paths'")
    argv.add_force(compare)
    argv.add_heartbeat(compare)
    compare.add_argument("--out", default="reports/compare", metavar="DIR", action=argv.Store,
                         help="folder for report.html, report.md, summary.json, PNGs (default: %(default)s)")
    argv.add_target(compare)

    parity = argv.subcommand(sub, "parity", help="train each strategy in jaxdp and torch_ref and compare them step "
                             "by step", description="Each strategy in both frameworks, judged step by step.")
    argv.add_run_arguments(parity, exclude=NO_CHECKPOINT)
    argv.add_strategies(parity, PARITY_DEFAULT, EITHER,
                        "a name both sides have, ddp-pmap / ddp-naive (paired with ddp), or JAX~TORCH", pairs=True)
    argv.add_force(parity)
    argv.add_heartbeat(parity)

    bench = argv.subcommand(sub, "bench", help="benchmarks, side by side in one run: writes bench.json and bench.md",
                            description="Benchmarks as ratios measured side by side in one run.")
    bench.add_argument("--quick", action=argv.Switch, default=False,
                       help="tiny sizes and few repeats (a smoke run) (default: %(default)s)")
    bench.add_argument("--out", default="reports/bench", metavar="DIR", action=argv.Store,
                       help="folder for bench.json and bench.md (default: %(default)s)")
    kernel_paths.add(bench, "mirrored,fused", "items 1-3's timed runs (item 13 always times both)")
    argv.add_heartbeat(bench)


def build_parser() -> argv.Parser:
    parser = argv.Parser(prog="jaxdp", description="Data parallelism in JAX, checked against PyTorch.",
                         epilog=errors.EPILOG)
    argv.add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=argv.Parser)
    _add_train(sub)
    _add_analyses(sub)
    _add_pairs(sub)
    cli_diff.add_parser(sub)
    cli_check.add_parser(sub)
    return parser


@guarded("jaxdp")  # Ctrl-C: one line and status 130 (interrupt.py)
def main(argv_=None) -> int:
    args = build_parser().parse_args(argv_)
    try:
        if args.command in TORCH_COMMANDS:
            config.require_torch(f"jaxdp {args.command}")
            # one GPU shared with torch in this process: JAX takes memory as it needs it, not 75% up front
            os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
            argv.check_seconds(args, ("heartbeat", "startup_timeout"))  # its torch ranks' (torch_ref.launch)
        run = {"train": cli_train.train, "memory": cli_runs.memory, "inspect": cli_runs.inspect,
               "parity": cli_runs.parity, "compare": cli_runs.compare, "bench": cli_runs.bench,
               "diff": cli_diff.main,
               "check": check_torch.main if getattr(args, "framework", "jax") == "torch" else cli_check.main
               }[args.command]
        json_out = atomic.json_on_stdout() if getattr(args, "json", None) == atomic.STDOUT else contextlib.nullcontext()
        with heartbeat.configured(getattr(args, "heartbeat", None), getattr(args, "startup_timeout", None)), json_out:
            return run(args)  # --json -: stdout is the document's, the text stderr's
    except cli_train.answered() as e:
        if isinstance(e, BrokenPipeError) and stdout_closed():
            raise  # stdout's reader has gone: a quiet end (interrupt.guarded), not an error line
        print(f"jaxdp: error: {errors.one_line(e)}", file=sys.stderr)
        return errors.exit_status(e)  # 2 bad input; 3 a failed run or file (RunFailed, OSError): errors.py
    except BaseException as e:  # a full disk inside a library's own exception (orbax's, DCP's): its one line
        full = disk_full.find(e)
        if full is None:
            raise
        print(f"jaxdp: error: {disk_full.line(full)}", file=sys.stderr)
        return errors.EXIT_FAILED


def check_example(path: str, functions: tuple, *flags: str) -> None:
    """`python examples/check_*.py [--function F] [--devices N]`: `jaxdp check PATH:F --devices N FLAGS`, and exit
    with its status (examples/check_jax.py, examples/check_torch.py)."""
    import argparse

    parser = argparse.ArgumentParser(description=f"jaxdp check {os.path.basename(path)}:FUNCTION {' '.join(flags)}",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--function", default=functions[0], choices=functions,
                        help="the FUNCTION of this file to check")
    parser.add_argument("--devices", type=int, default=2, help="the devices (or torch ranks) given to it")
    given = parser.parse_args()
    sys.exit(main(["check", f"{path}:{given.function}", "--devices", str(given.devices), *flags]))


if __name__ == "__main__":
    sys.exit(main())
