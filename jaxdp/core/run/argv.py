"""The command-line flags, defined once for `jaxdp` and `python -m torch_ref`.

`Parser` answers every bad input in one line (the flag, the value, the fix) and exit status 2,
never argparse's usage block, and answers a typo'd flag from the subcommand it was given to.
`add_run_arguments` adds one flag per `RunConfig` field (less those a command does not read),
`add_strategies`, `add_trace`, `add_timeout` and `add_heartbeat` (with --startup-timeout) the flags both
frameworks share, each recording which flags the user typed; `configs` turns the namespace into one
validated RunConfig per strategy and refuses a typed flag that the chosen model or strategies would not read.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import sys

from .. import errors
from ..errors import ConfigError
from ..memory import fits
from ..process import heartbeat
from ..registry import strategies as registry
from . import config, readers, targets, values

GIVEN = "given_flags"  # the namespace attribute holding the dests the user typed


def given(namespace) -> set:
    """The flags (dest names) typed on the command line."""
    return namespace.__dict__.setdefault(GIVEN, set())


SPELLED = "spelled_flags"  # the namespace attribute holding {dest: the spelling typed first}


def _once(parser, namespace, dest: str, option_string, value) -> None:
    """A flag typed twice (under either spelling: --strategy and --strategies) with different values is
    refused in one line naming both; the same value twice is harmless."""
    spelled = namespace.__dict__.setdefault(SPELLED, {})
    if dest in given(namespace) and getattr(namespace, dest) != value:
        first, earlier = spelled.get(dest, option_string), getattr(namespace, dest)
        shown = [",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v) for v in (earlier, value)]
        parser.error(f"{first} {shown[0]} and {option_string} {shown[1]}: the same flag given twice with "
                     f"different values; give it once")
    spelled.setdefault(dest, option_string)


class Store(argparse.Action):
    """argparse's store, remembering that the flag was typed (`given`); refused when typed twice differently."""

    def __call__(self, parser, namespace, values, option_string=None):
        _once(parser, namespace, self.dest, option_string, values)
        setattr(namespace, self.dest, values)
        given(namespace).add(self.dest)


class Switch(argparse.BooleanOptionalAction):
    """--flag / --no-flag, remembering that it was typed; refused when typed both ways."""

    def __call__(self, parser, namespace, values, option_string=None):
        _once(parser, namespace, self.dest, option_string, not option_string.startswith("--no-"))
        super().__call__(parser, namespace, values, option_string)
        given(namespace).add(self.dest)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors that name the fix; subcommand parsers are Parsers too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # --step is not --steps: a typo is an error, not a guess
        super().__init__(*args, **kwargs)

    def error(self, message):
        print(f"{self.prog}: error: {message}{self._fix(message)}", file=sys.stderr)
        sys.exit(2)

    def _fix(self, message: str) -> str:
        action = self._action_named(message)
        if action is not None and action.type in (int, float) and "invalid" in message:
            example = values.RULES[action.dest].example if action.dest in values.RULES else action.default
            return (f"; give {'a whole number' if action.type is int else 'a number'}, e.g. "
                    f"{action.option_strings[0]} {example} (see {self.prog} -h)")
        if action is not None and "expected one argument" in message:
            example = values.RULES[action.dest].example if action.dest in values.RULES else action.metavar or "VALUE"
            return (f"; give a value, e.g. {action.option_strings[0]} {example} (a value starting with '-' as "
                    f"{action.option_strings[0]}=-1)")
        if message.startswith("unrecognized arguments"):
            typed = message.split(":", 1)[1].split()[0].split("=")[0]
            close = difflib.get_close_matches(typed, [o for o in self._option_string_actions if o.startswith("--")],
                                              n=1, cutoff=0.6)
            return f"; did you mean {close[0]}? (see {self.prog} -h)" if close else f"; see {self.prog} -h"
        return f"; see {self.prog} -h"

    def _action_named(self, message: str):
        """The action an argparse message is about ('argument --steps: ...'), or None."""
        if not message.startswith("argument "):
            return None
        names = message[len("argument "):].split(":", 1)[0].split("/")
        return next((a for a in self._actions if set(a.option_strings) & set(names)), None)

    def parse_args(self, args=None, namespace=None):
        args, extra = self.parse_known_args(args, namespace)
        if extra:
            sub = getattr(args, "_parser", self)
            sub.error(f"unrecognized arguments: {' '.join(extra)}")
        return args


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_run_arguments(parser, exclude=()) -> None:
    """One `--flag` per RunConfig field (the single definition of the run flags), less `exclude`."""
    for f in dataclasses.fields(config.RunConfig):
        if f.name in exclude or f.name == "strategy":
            continue
        meta = f.metadata
        if f.type in ("bool", bool) and not meta.get("type"):  # --flag / --no-flag
            parser.add_argument(_flag(f.name), dest=f.name, default=f.default, action=Switch,
                                help=meta["help"] + " (default: %(default)s)")
            continue
        kind = meta.get("type") or {"int": int, "float": float, "str": str}[f.type]
        shown = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else "%(default)s"
        parser.add_argument(_flag(f.name), dest=f.name, default=f.default, type=kind, choices=meta.get("choices"),
                            action=Store, help=meta["help"] + f" (default: {shown})")


def strategy_list(valid, pairs: bool = False):
    """An argparse type: comma-separated strategy names from `valid` (aliases resolved)."""
    def parse(text: str) -> list[str]:
        names = [config.ALIASES.get(n.strip(), n.strip()) for n in text.split(",") if n.strip()]
        bad = [n for n in names if n not in valid and not (pairs and "~" in n)]
        if not names:
            raise argparse.ArgumentTypeError(f"no strategy in {text!r}; e.g. ddp or ddp,zero3")
        if bad and bad[0] in config.ALL_STRATEGIES:
            owners = [config.PACKAGE[f] for f, known in config.FRAMEWORK_STRATEGIES.items() if bad[0] in known]
            here = [config.PACKAGE[f] for f, known in config.FRAMEWORK_STRATEGIES.items() if set(valid) <= set(known)]
            raise argparse.ArgumentTypeError(f"strategy {bad[0]!r} exists only in {' and '.join(owners)}; "
                                             f"{' and '.join(here) or 'this command'} has: {', '.join(valid)}")
        if bad:
            raise argparse.ArgumentTypeError(f"invalid choice: {bad[0]!r} (choose from {', '.join(valid)}"
                                             + (", or JAX~TORCH)" if pairs else ")"))
        return names
    return parse


def add_version(parser) -> None:
    """--version: the program's name and the package's version (`jaxdp.__version__`, pyproject's), status 0."""
    from ... import __version__

    parser.add_argument("--version", action="version", version=f"{parser.prog} {__version__}")


def add_strategies(parser, default: str, valid, what: str, pairs: bool = False) -> None:
    """`--strategy` and `--strategies`: the same flag, one name or several comma-separated."""
    parser.add_argument("--strategy", "--strategies", dest="strategies", default=strategy_list(valid, pairs)(default),
                        type=strategy_list(valid, pairs), action=Store, metavar="NAME[,NAME...]",
                        help=f"{what}; one of {', '.join(valid)}, or several comma-separated (default: {default})")


def add_trace(parser, who: str = "") -> None:
    parser.add_argument("--trace", default=None, metavar="PATH", action=Store,
                        help=f"write the trace (.npz) here{who}; with several strategies put {{strategy}} in it")


def add_timeout(parser, what: str) -> None:
    parser.add_argument("--timeout", type=float, default=3600.0, action=Store, metavar="SECONDS",
                        help=f"{what}: stop every process after this many seconds (default: %(default)s)")


def add_processes(parser) -> None:
    """--processes P: the same flag in `jaxdp train` and `torch_ref train` (where a rank holds one device, so P
    can only be --devices: `torch_cli`)."""
    parser.add_argument("--processes", type=int, default=1, action=Store,
                        help="start this many processes on this machine, each holding --devices / P devices "
                             "(default: %(default)s)")


def add_heartbeat(parser) -> None:
    """--heartbeat and --startup-timeout: the same flags wherever worker processes start (`jaxdp train
    --processes P`, `torch_ref train --devices N`, and the torch ranks of `jaxdp compare`, `parity`, `bench`)."""
    parser.add_argument("--heartbeat", type=float, default=heartbeat.DEFAULT_S, action=Store, metavar="SECONDS",
                        help="a worker process (of --processes P, or a torch rank) silent this long since its first "
                             "beat (stopped, frozen) is named and the run stopped, status 3 (default: %(default)s)")
    parser.add_argument("--startup-timeout", type=float, default=heartbeat.STARTUP_S, action=Store,
                        metavar="SECONDS", help="a worker process with no first heartbeat this long after the launch "
                        "(starting Python, importing JAX or torch: slow on a loaded machine) is named and the run "
                        "stopped, status 3 (default: %(default)s)")


def add_force(parser) -> None:
    """--force: run although the size check (`jaxdp.core.memory.fits`) says the run cannot fit this machine."""
    parser.add_argument("--force", default=False, action=Switch,
                        help="run even when the size check estimates that the run cannot fit this machine's "
                             "memory or cores (docs/RELIABILITY.md) (default: %(default)s)")


def add_target(parser) -> None:
    """--target and --nodes: compile for GPUs this machine does not have (docs/GPU.md; the `gpu-aot` extra)."""
    group = parser.add_argument_group("GPU target (compiled on this machine, no GPU needed: docs/GPU.md)")
    group.add_argument("--target", default=None, choices=tuple(targets.TARGETS), action=Store,
                       help="compile the step for --devices GPUs of this kind with XLA:GPU and read that program "
                            "(needs the gpu-aot extra: " + targets.INSTALL + ")")
    group.add_argument("--nodes", type=int, default=1, action=Store, metavar="K",
                       help=f"--target: the GPUs on K nodes of --devices / K each (NVLink within a node, "
                            f"InfiniBand across) (default: %(default)s; a node holds at most "
                            f"{targets.GPUS_PER_NODE} GPUs: more --devices need more nodes)")


def check_target(args) -> None:
    """--target's inputs, before any work: the extra installed, --nodes only with --target and dividing
    --devices; one line naming the fix."""
    if args.nodes < 1:
        raise ConfigError(f"--nodes {args.nodes}: give a whole number of nodes >= 1")
    if getattr(args, "target", None) is None:
        if "nodes" in given(args):
            raise ConfigError("--nodes is for --target (the nodes of the GPUs compiled for): add --target or drop it")
        return
    targets.require_extra()
    targets.check(args.target, args.devices, args.nodes)
    model = config.PRESETS.get(getattr(args, "preset", ""), {}).get("model", args.model)
    targets.check_run([config.ALIASES.get(s, s) for s in args.strategies], model)


def check_seconds(args, names) -> None:
    """Each of the flags `names` (dests) a finite number of seconds > 0, or one line naming it."""
    for name in names:
        value, flag = getattr(args, name), _flag(name)
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{flag} {value}: must be a finite number of seconds > 0; e.g. {flag} 60")


def subcommand(sub, name: str, **kwargs) -> Parser:
    """A subcommand parser that remembers itself, so that a typo is answered from it."""
    kwargs.setdefault("epilog", errors.EPILOG)  # every command's -h ends with the exit-status table
    parser = sub.add_parser(name, **kwargs)
    parser.set_defaults(_parser=parser)
    return parser


def configs(args, framework: str = "jax", names=None, single_on_one: bool = False) -> list[config.RunConfig]:
    """One validated RunConfig per strategy (`names`, default `args.strategies`; `single_on_one`: a one-device
    strategy on one device, as parity runs it); a typed flag that no chosen model or strategy reads is refused."""
    fields = {f.name for f in dataclasses.fields(config.RunConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields and k != "strategy"}
    typed = given(args) & fields
    preset = config.PRESETS.get(values.get("preset", ""), {})
    clash = sorted(typed & set(preset))
    if clash:
        raise ConfigError(f"{_flag(clash[0])} is set by --preset {values['preset']}: drop one of them")
    empty = sorted(k for k in typed if isinstance(values.get(k), str) and not values[k].strip())
    if empty:
        raise ConfigError(f"{_flag(empty[0])} is empty; give a value or drop the flag (see -h)")
    only = readers.STRATEGY_FLAGS[framework]  # a strategy option goes to the strategies that read it
    cfgs = []
    for s in names or args.strategies:
        mine = {k: v for k, v in values.items() if k not in only or config.ALIASES.get(s, s) in only[k]}
        cfg = config.RunConfig(**mine, strategy=s)
        cfgs.append(cfg.replace(devices=1) if single_on_one and registry.on_one_device(cfg.strategy) else cfg)
    runs = getattr(args, "runs", None) or [(framework, c.strategy) for c in cfgs]  # compare, parity: both sides
    readers.check_given(typed, cfgs[0].model, runs, cfgs[0].reduction)
    where = dict(processes=getattr(args, "processes", 1), hosts=getattr(args, "num_processes", None) or 1,
                 force=getattr(args, "force", False), target=getattr(args, "target", None))
    for cfg in cfgs:  # the caps before the configuration's checks: --devices 100000 is answered by its cap
        fits.check_count(cfg, framework, **where)
    cfgs = [c.validate(framework) for c in cfgs]
    steps = getattr(args, "command", None) != "inspect"  # inspect compiles the step, runs none: no activations
    reports = getattr(args, "command", None) == "memory"  # memory --target answers `fits` per strategy: no refusal
    fits.check_fit(cfgs, framework, **where, steps=steps, device_check=not reports)  # before any device or model
    return cfgs
