"""`--kernels` on `compare` and `bench`: a comma-separated list of paths (`mirrored`, `fused`), each framework
run on each, every row of their tables naming its path (and torch's: eager or compiled). The other commands
take one path (the run flag, `RunConfig.kernels`). docs/KERNELS.md, "In compare and bench"."""
from __future__ import annotations

import argparse

from ..core.run import argv
from ..core.run.kernels import KERNELS


def paths(text: str) -> tuple[str, ...]:
    """An argparse type: the paths in the order given, each once."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"no path in {text!r}; e.g. mirrored or mirrored,fused")
    bad = [n for n in names if n not in KERNELS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown kernels {bad[0]!r} (choose from {', '.join(KERNELS)}, or several "
                                         "comma-separated)")
    if len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(f"{text!r} names a path twice; give each once, e.g. mirrored,fused")
    return tuple(names)


def add(parser, default: str, what: str) -> None:
    """`--kernels PATH[,PATH...]`: compare's replaces its run flag (one path); bench, which has no run flags,
    gains it and `--compile`."""
    help_ = (f"the kernel paths, comma-separated, each framework run on each ({', '.join(KERNELS)}: "
             f"docs/KERNELS.md); {what} (default: {default})")
    action = next((a for a in parser._actions if a.dest == "kernels"), None)
    if action is None:
        parser.add_argument("--kernels", default=paths(default), type=paths, action=argv.Store,
                            metavar="PATH[,PATH...]", help=help_)
        parser.add_argument("--compile", default=False, action=argv.Switch,
                            help="torch_ref: torch.compile the model in the timed runs (default: %(default)s)")
        return
    action.type, action.choices, action.default, action.metavar, action.help = \
        paths, None, paths(default), "PATH[,PATH...]", help_


def label(kernels: str, framework: str, compiled: bool = False) -> str:
    """A row's path as the tables print it: jaxdp's `mirrored` / `fused`; torch_ref's with `eager` or `compiled`."""
    return kernels if framework == "jax" else f"{kernels}, {'compiled' if compiled else 'eager'}"
