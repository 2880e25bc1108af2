"""`jaxdp check FILE.py:FUNCTION --intent ddp|zero1|zero2|zero3|hsdp`: your own data-parallel step, compiled, its
collectives read from the program and set against what you meant (`jaxdp.check`, docs/CHECK.md).

FUNCTION(devices) gets the devices to build a mesh on (`--devices` CPU devices, simulated, or the GPUs of a
`--target`) and returns `(step, args)`: the jitted step and its arguments, placed with their shardings (under
`--target`: `jax.ShapeDtypeStruct`s with shardings, nothing is allocated). Exit status 0 when the program keeps
the contract, 1 when it departs from it, 2 on bad input, 3 when FUNCTION or the compilation fails.

`--framework torch`: FUNCTION(rank, world) runs on every rank of a gloo CPU world of `--devices` ranks and returns
`(step, args, model, optimizer)`; one step runs under `torch_ref.check` and rank 0's report is printed
(jaxdp/harness/check_torch.py)."""
from __future__ import annotations

from ..core.contract import user
from ..core.contract.intent import DTYPES, INTENTS, Intent
from ..core.errors import ConfigError, RunFailed
from ..core.files import atomic, paths
from ..core.registry import strategies as registry
from ..core.run import argv, targets

RETURNS = {"jax": "a function of the devices returning (step, args)",
           "torch": "a function of (rank, world) returning (step, args, model, optimizer)"}


def add_parser(sub) -> None:
    check = argv.subcommand(sub, "check", help="what your own data-parallel step sends, read from its compiled "
                            "program, against what you meant", description="Is my data parallelism doing what I "
                            "think? (docs/CHECK.md)")
    check.add_argument("step", metavar="FILE.py:FUNCTION", help="FUNCTION(devices) in FILE.py (or a module:FUNCTION) "
                       "returns (the jitted step, its arguments placed with their shardings); with --framework "
                       "torch FUNCTION(rank, world) returns (step, args, model, optimizer)")
    check.add_argument("--framework", default="jax", choices=("jax", "torch"), action=argv.Store,
                       help="jax: compile the step and read its program; torch: run one step on every rank of a "
                            "gloo CPU world of --devices ranks and record its collectives (default: %(default)s)")
    check.add_argument("--intent", default=registry.DEFAULT, choices=INTENTS, action=argv.Store,
                       help="the data-parallel layout you meant (default: %(default)s)")
    check.add_argument("--accumulation", type=int, default=1, metavar="K", action=argv.Store,
                       help="micro-batches per optimizer step: the gradients synced once per step "
                            "(default: %(default)s)")
    check.add_argument("--inner-steps", type=int, default=1, metavar="K", action=argv.Store,
                       help="--intent diloco: the steps between the parameters' all-reduces, which the textbook "
                            "counts as 1/K per step (default: %(default)s)")
    check.add_argument("--reduce-dtype", default="float32", choices=DTYPES, action=argv.Store,
                       help="the dtype the gradients should be reduced in (default: %(default)s)")
    check.add_argument("--master-dtype", default="float32", choices=DTYPES, action=argv.Store,
                       help="the dtype the parameters the step updates and the optimizer state should be held in "
                            "(default: %(default)s)")
    check.add_argument("--devices", type=int, default=4, metavar="N", action=argv.Store,
                       help="devices given to FUNCTION (simulated CPU devices unless GPUs are present, or the GPUs "
                            "of --target) (default: %(default)s)")
    check.add_argument("--json", default=None, metavar="PATH", action=argv.Store,
                       help="also write the report as JSON here ('-': stdout, the text then on stderr)")
    argv.add_target(check)
    argv.add_timeout(check, "--framework torch's world")
    check.set_defaults(timeout=600.0)


def _checked(args) -> tuple[str, str, Intent]:
    """(where FUNCTION lives, its name, the intent), every input checked before any work; one line naming the fix."""
    where, name = user.split(args.step, RETURNS[args.framework])
    if args.json not in (None, atomic.STDOUT):
        paths.output_file(args.json, "--json")
    if args.devices < 1:
        raise ConfigError(f"--devices {args.devices}: give a whole number of devices >= 1")
    if args.nodes < 1:
        raise ConfigError(f"--nodes {args.nodes}: give a whole number of nodes >= 1")
    argv.check_seconds(args, ("timeout",))
    if args.framework == "torch" and args.target is not None:
        raise ConfigError("--target is for --framework jax (a compiled program); a torch step runs on a CPU world: "
                          "drop --target")
    if args.target is not None:
        targets.require_extra()
        targets.check(args.target, args.devices, args.nodes)
    elif "nodes" in argv.given(args):
        raise ConfigError("--nodes is for --target (the nodes of the GPUs compiled for): add --target or drop it")
    if "inner_steps" in argv.given(args) and registry.get(args.intent, "comm") != "outer":
        raise ConfigError(f"--inner-steps {args.inner_steps} is for --intent "
                          f"{' or '.join(registry.names(comm='outer'))}: drop it")
    return where, name, Intent(args.intent, args.accumulation, args.reduce_dtype, master_dtype=args.master_dtype,
                               inner_steps=args.inner_steps)


def _devices(args) -> list:
    if args.target is not None:
        from ..analysis import aot

        return list(aot.topology_mesh(args.target, args.devices, args.nodes).devices.flat)
    from .. import devices

    return devices.setup(args.devices)


def checked(args) -> tuple[str, str, Intent]:
    """(FILE.py or module, FUNCTION, the intent): every flag checked and FUNCTION found, before any work."""
    where, name, want = _checked(args)
    user.load(where, name)
    return where, name, want


def main(args) -> int:
    where, name, want = _checked(args)
    fn = user.load(where, name)
    found = _devices(args)
    try:
        built = fn(found)
    except (ConfigError, RunFailed):
        raise
    except Exception as e:
        raise RunFailed(f"{args.step}: {type(e).__name__}: {e}") from e
    if not (isinstance(built, tuple) and len(built) == 2 and callable(built[0])):
        raise ConfigError(f"{args.step} returned {type(built).__name__}; it must return (step, args): the jitted "
                          f"step and a tuple of its arguments")
    from .check import check

    try:
        report = check(built[0], *built[1], intent=want.name, accumulation=want.accumulation,
                       reduce_dtype=want.reduce_dtype, master_dtype=want.master_dtype, inner_steps=want.inner_steps)
    except Exception as e:
        raise RunFailed(f"{args.step}: compiling the step failed: {type(e).__name__}: {e}") from e
    return shown(args, report.to_text(), report.to_dict())


def shown(args, text: str, report: dict) -> int:
    """Print the report, write its JSON (--json), and answer 0 kept, 1 departed."""
    print(text)
    if args.json:
        atomic.write_json(args.json, report, indent=1)
    return 0 if report["ok"] else 1
