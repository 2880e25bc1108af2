"""Two processes, four devices: `jaxdp train --processes 2` runs real jax.distributed processes
(coordinator on a loopback port, gloo collectives), each holding two of the four devices and feeding
only its own rows of every batch. Its trace equals that of the same flags run in one process on four
devices (here, this process, through `jaxdp.train.run`) to float64 rounding: the global batches (x, y)
and initial weights bit for bit; losses, gradients and parameters within about 1e-15 of the largest
value (the same sums, added in another order).

    python examples/multi_process.py [--quick]

`--quick` trains 3 steps instead of 20. Exit status 1 when the two traces differ beyond 1e-12.
"""
import argparse
import os
import subprocess
import sys
import tempfile

from jaxdp import devices, train
from jaxdp.core.process import xla_flags
from jaxdp.core.run import argv, config
from jaxdp.core.traces import trace

BOUND = 1e-12  # float64: what a different order of the same sums can change


def one_process(flags: list[str], path: str) -> None:
    """The reference: the run `jaxdp train FLAGS` describes, in this process on its own devices."""
    parser = argv.Parser()
    argv.add_run_arguments(parser)
    argv.add_strategies(parser, "ddp", config.FRAMEWORK_STRATEGIES["jax"], "strategy")
    (cfg,) = argv.configs(parser.parse_args(flags))
    devices.setup(cfg.devices)
    result = train.run(cfg, trace_path=path, progress=False)
    print(f"1 process x {cfg.devices} devices:  loss {result.losses[0]:.4f} -> {result.losses[-1]:.4f}")


def processes(flags: list[str], n: int, path: str) -> None:
    """`jaxdp train FLAGS --processes N`: N fresh processes, each with its own share of the devices."""
    env = xla_flags.for_child(os.environ)  # each process sets its own device count (and FMA)
    argv = [sys.executable, "-m", "jaxdp", "train", *flags, "--processes", str(n), "--trace", path]
    run = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    if run.returncode:
        sys.exit(f"jaxdp train --processes {n} failed (exit {run.returncode}): {run.stderr.strip()[-2000:]}")
    losses = trace.load(path).losses()
    print(f"{n} processes x 2 devices: loss {losses[0]:.4f} -> {losses[-1]:.4f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 steps instead of 20 (smoke test)")
    args = parser.parse_args()

    flags = ["--strategy", "zero2", "--devices", "4", "--steps", "3" if args.quick else "20", "--batch-size", "32",
             "--dtype", "float64", "--optimizer", "adam", "--lr", "1e-2"]
    with tempfile.TemporaryDirectory() as tmp:
        one, two = os.path.join(tmp, "one.npz"), os.path.join(tmp, "two.npz")
        one_process(flags, one)
        processes(flags, 2, two)
        result = trace.diff(trace.load(two), trace.load(one))
    print("2 processes x 2 devices against 1 process x 4 devices, per field of the trace:")
    print(trace.format_diff(result, tolerance=BOUND))
    same = all(err <= BOUND for err in result.worst.values())
    print(f"verdict: {'the same run, to float64 rounding' if same else 'the runs DIFFER'} (bound {BOUND:g} relative)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
